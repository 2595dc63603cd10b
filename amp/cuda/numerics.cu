// The numerics report's counters on the GPU: one pass over a tensor (for an update, one
// pass over before, after and grad together), each thread counting its elements in
// registers, each block combining its threads' counts (block_reduce) and adding them to a
// small device buffer, one atomic per counter; the host reads the buffer back with one copy.
//
// Per element x, in double, the CPU loop's rule (amp/numerics.cpp):
//   values:  NaN: nan; else inf: inf; else a = |x|: max_abs = max(max_abs, a), and
//            a == 0: zero; 0 < a < 2^-14: fp16 subnormal, and also fp16 underflow if a < 2^-25
//   updates: d = after - before; max_abs = max(max_abs, |d|), where a NaN d leaves max_abs
//            (std::max(m, NaN) is m) and an infinite d is kept; d == 0: zero; grad finite
//            and nonzero: eligible, and lost when d == 0
// Why the classification equals the CPU's: every f16, bf16 and f32 value is exactly a
// double, so converting to double changes no value, and both sides then compare the same
// doubles against the same thresholds (amp/numerics.h); double arithmetic and comparisons
// never flush subnormals, and the project builds without --ftz / fast math, so f32
// subnormals reach the double unflushed. The difference after - before is one IEEE double
// subtraction on both sides (nothing to fuse).
//
// The max across blocks: atomicMax on max_abs's bit pattern read as an unsigned 64-bit
// integer. For non-negative doubles (sign bit 0; a NaN is never stored) the order of the
// bit patterns is the order of the values: the biased exponent sits above the mantissa, so
// a larger value has a larger exponent field, or the same one and a larger mantissa; +0 is
// all zero bits (the buffer's initial value, as the CPU's max_abs starts at 0) and +inf
// (0x7ff0...) lies above every finite value. Counts add exactly and max is commutative, so
// the result does not depend on the order in which blocks finish.
// Bytes: each element read once (before, after and grad once each for an update); 64 bytes
// of counters per block.
#include <algorithm>
#include <bit>
#include <vector>

#include "amp/cuda/numerics.h"
#include "core/copy.h"
#include "core/cuda/block_reduce.cuh"
#include "core/cuda/convert.cuh"
#include "core/cuda/dispatch.cuh"
#include "core/cuda/launch.cuh"
#include "core/cuda/pack.cuh"
#include "core/cuda/runtime.h"

namespace precis::amp::cuda {

using namespace precis::cuda;  // the device toolkit: dispatch, launches, packs, reductions

namespace {

// The device buffer: kCounters counts, then max_abs's bits.
enum Slot : int { kZero, kSubnormal, kUnderflow, kInf, kNan, kEligible, kLost, kCounters, kMaxAbsBits = kCounters };
constexpr int kSlots = kMaxAbsBits + 1;

struct Counts {
  unsigned long long n[kCounters];
  double max_abs;
};

// The Reducer for block_reduce (core/cuda/block_reduce.cuh).
struct CountsReducer {
  using Acc = Counts;
  __device__ Counts identity() const { return Counts{}; }
  __device__ Counts combine(Counts a, const Counts& b) const {
#pragma unroll
    for (int k = 0; k < kCounters; ++k) a.n[k] += b.n[k];
    a.max_abs = a.max_abs < b.max_abs ? b.max_abs : a.max_abs;
    return a;
  }
};

__device__ __forceinline__ void count_value(double x, Counts& c) {
  if (isnan(x)) {
    ++c.n[kNan];
    return;
  }
  if (isinf(x)) {
    ++c.n[kInf];
    return;
  }
  const double a = fabs(x);
  c.max_abs = c.max_abs < a ? a : c.max_abs;
  if (a == 0) {
    ++c.n[kZero];
  } else if (a < kFp16MinNormal) {
    ++c.n[kSubnormal];
    if (a < kFp16HalfMinSubnormal) ++c.n[kUnderflow];
  }
}

__device__ __forceinline__ void count_update(double before, double after, double grad, Counts& c) {
  const double delta = after - before;
  const double a = fabs(delta);
  c.max_abs = c.max_abs < a ? a : c.max_abs;  // false for a NaN a: the max stays
  if (delta == 0) ++c.n[kZero];
  if (grad != 0 && isfinite(grad)) {
    ++c.n[kEligible];
    if (delta == 0) ++c.n[kLost];
  }
}

// The block's counts into the buffer (every thread calls it; thread 0 adds).
__device__ __forceinline__ void add_block_counts(Counts c, unsigned long long* out) {
  c = block_reduce(CountsReducer{}, c);
  if (threadIdx.x != 0) return;
#pragma unroll
  for (int k = 0; k < kCounters; ++k)
    if (c.n[k] != 0) atomicAdd(out + k, c.n[k]);
  atomicMax(out + kMaxAbsBits, static_cast<unsigned long long>(__double_as_longlong(c.max_abs)));
}

template <int kPack, typename T>
__global__ void __launch_bounds__(kBlockSize) values_kernel(const T* x, int64_t n, unsigned long long* out) {
  precis::cuda::wait_for_previous_grid();
  precis::cuda::allow_next_grid_to_start();
  Counts c{};
  for_each_in_row<kPack>(x, n, blockIdx.x * blockDim.x + threadIdx.x, gridDim.x * blockDim.x,
                         [&](int64_t i, auto width) {
                           constexpr int W = decltype(width)::value;
                           const Pack<T, W> v = load_pack<W>(x + i);
#pragma unroll
                           for (int k = 0; k < W; ++k) count_value(convert_to<double>(v.v[k]), c);
                         });
  add_block_counts(c, out);
}

// kPack > 1 only where before and grad are in after's pack phase (same_pack_phase).
template <int kPack, typename T, typename G>
__global__ void __launch_bounds__(kBlockSize)
    update_kernel(const T* before, const T* after, const G* grad, int64_t n, unsigned long long* out) {
  precis::cuda::wait_for_previous_grid();
  precis::cuda::allow_next_grid_to_start();
  Counts c{};
  for_each_in_row<kPack>(
      after, n, blockIdx.x * blockDim.x + threadIdx.x, gridDim.x * blockDim.x, [&](int64_t i, auto width) {
        constexpr int W = decltype(width)::value;
        const Pack<T, W> b = load_pack<W>(before + i), a = load_pack<W>(after + i);
        const Pack<G, W> g = load_pack<W>(grad + i);
#pragma unroll
        for (int k = 0; k < W; ++k)
          count_update(convert_to<double>(b.v[k]), convert_to<double>(a.v[k]), convert_to<double>(g.v[k]), c);
      });
  add_block_counts(c, out);
}

// As many blocks as the GPU holds at once (each thread then loops), fewer for a small tensor.
template <typename Kernel>
unsigned blocks_for(Kernel kernel, int64_t n, int pack, Device device) {
  const int64_t resident =
      static_cast<int64_t>(resident_blocks_per_sm(reinterpret_cast<const void*>(kernel), kBlockSize)) *
      multiprocessor_count(device);
  return static_cast<unsigned>(std::min<int64_t>(grid_for(n, pack), resident));
}

// Adds the counts of `n` elements on `device` to `stats`: launch(stream, out) queues the kernel
// on the device's compute stream, `out` a zeroed counter buffer from the caching allocator;
// then one copy, which waits for the kernel, brings the buffer back.
template <typename Launch>
void count_on_device(Device device, int64_t n, const char* op, TensorNumerics& stats, Launch&& launch) {
  stats.count += n;
  if (n == 0) return;
  DeviceGuard guard(device);
  cudaStream_t stream = compute_stream(device);
  const Tensor counters = empty({kSlots}, DType::i64, device);
  PRECIS_CUDA_CHECK(cudaMemsetAsync(counters.raw_data(), 0, counters.nbytes(), stream), op);
  launch(stream, static_cast<unsigned long long*>(counters.raw_data()));
  PRECIS_CUDA_CHECK_LAUNCH(op);
  const std::vector<int64_t> c = counters.to_vector<int64_t>();
  stats.zero += c[kZero];
  stats.fp16_subnormal += c[kSubnormal];
  stats.fp16_underflow += c[kUnderflow];
  stats.inf += c[kInf];
  stats.nan += c[kNan];
  stats.eligible += c[kEligible];
  stats.lost += c[kLost];
  stats.max_abs = std::max(stats.max_abs, std::bit_cast<double>(c[kMaxAbsBits]));
}

}  // namespace

void add_values(const Tensor& t, TensorNumerics& stats) {
  const char* op = "numerics report (values)";
  PRECIS_CHECK(t.is_cuda(), op, ": expected a GPU tensor, got ", describe(t));
  const Tensor x = dense(t);
  count_on_device(x.device(), x.numel(), op, stats, [&](cudaStream_t stream, unsigned long long* out) {
    dispatch_floating(x.dtype(), op, [&](auto tag) {
      using T = typename decltype(tag)::type;
      constexpr int kPack = Packed128<T>::size;
      auto kernel = values_kernel<kPack, T>;
      precis::cuda::launch(kernel, blocks_for(kernel, x.numel(), kPack, x.device()), kBlockSize, 0, stream,
                           data_of<const T>(x), x.numel(), out);
    });
  });
}

void add_update(const Tensor& before, const Tensor& after, const Tensor& grad, TensorNumerics& stats) {
  const char* op = "numerics report (updates)";
  PRECIS_CHECK(after.is_cuda() && before.device() == after.device() && grad.device() == after.device(), op,
               ": before, after and grad must be on one GPU, got ", describe(before), ", ", describe(after), " and ",
               describe(grad));
  PRECIS_CHECK(before.dtype() == after.dtype() && before.shape() == after.shape() && grad.shape() == after.shape(), op,
               ": before and after must have one dtype and shape, and grad that shape, got ", describe(before), ", ",
               describe(after), " and ", describe(grad));
  const Tensor b = dense(before), a = dense(after);
  // A gradient in another dtype than the parameter is read as f64: exact for every floating dtype.
  const Tensor g = grad.dtype() == after.dtype() ? dense(grad) : converted(grad, DType::f64);
  const int64_t n = a.numel();
  count_on_device(a.device(), n, op, stats, [&](cudaStream_t stream, unsigned long long* out) {
    dispatch_floating(a.dtype(), op, [&](auto tag) {
      using T = typename decltype(tag)::type;
      auto run = [&](auto grad_tag) {
        using G = typename decltype(grad_tag)::type;
        constexpr int kPack = Packed128<T>::size;
        const T *bp = data_of<const T>(b), *ap = data_of<const T>(a);
        const G* gp = data_of<const G>(g);
        auto launch_with = [&](auto kernel, int pack) {
          precis::cuda::launch(kernel, blocks_for(kernel, n, pack, a.device()), kBlockSize, 0, stream, bp, ap, gp, n,
                               out);
        };
        if (same_pack_phase<kPack>(ap, bp) && same_pack_phase<kPack>(ap, gp))
          launch_with(update_kernel<kPack, T, G>, kPack);
        else
          launch_with(update_kernel<1, T, G>, 1);
      };
      if (g.dtype() == a.dtype())
        run(TypeTag<T>{});
      else
        run(TypeTag<double>{});
    });
  });
}

}  // namespace precis::amp::cuda
