// The CUDA kernels of the neural-network ops (softmax, layer norm, cross entropy,
// embedding), as plain C++ launchers on Tensors: ops/*.cpp validate, allocate the
// outputs on the device and call these; each runs on the compute stream of its
// tensors' device and does not synchronise, unless it says so.
//
// The second half, for *.cu files only, holds the device building blocks these
// kernels share: 16-byte packed loads, rows split around 16-byte boundaries, and
// deterministic warp/block reductions.
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace precis::ops::cuda {

// The first out-of-range index a kernel met (by position in the flattened index
// tensor), found on the device and copied back once; position -1 when none.
struct BadIndex {
  int64_t position = -1;
  int64_t value = 0;
};

// y = softmax(x) (or log_softmax) along the last dim; x, y dense, one shape and dtype.
void softmax_forward(const Tensor& x, const Tensor& y, bool log);
// dx from the output y and its gradient g; all dense, one shape and dtype.
void softmax_backward(const Tensor& y, const Tensor& g, const Tensor& dx, bool log);

// Layer norm over the last dim of the dense x ([rows, C] when flattened): y, and per
// row mean and rstd. mean, rstd are dense, f32 (f64 for f64 x); weight, bias [C] (and
// residual_bias) dense, in that dtype too, or all three in x's dtype when that is f16/bf16
// (read so where the kernel allows, else cast here first). y is
// dense, in x's dtype, f32 for f16/bf16 x, or f16/bf16 for f32 x. With a residual
// (add_layer_norm; dense, x's shape, in x's dtype or f16/bf16 for f32 x), sum = x + residual
// (+ residual_bias, [C], added to every row, when defined) is
// written (dense, x's dtype; summed in f32 and rounded once) and normalised instead of x.
void layer_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps, const Tensor& y,
                        const Tensor& mean, const Tensor& rstd, const Tensor& residual = Tensor(),
                        const Tensor& sum = Tensor(), const Tensor& residual_bias = Tensor());
// dx, dweight, dbias (each skipped when undefined; dweight/dbias [C] in the statistics
// dtype), from the dense x (the values normalised), the dense gradient g (in y's dtype) and
// the saved statistics (weight in either dtype that layer_norm_forward takes). For add_layer_norm: g_sum (dense, x's
// dtype; the gradient of the sum) is added to dx, and dresidual (dense, in the residual's dtype) gets dx's values too;
// dresidual_bias ([C], statistics dtype) gets the column sums of those values (the sum's
// whole gradient, summed unrounded, in a fixed order). accumulate_*: add to what dweight /
// dbias / dresidual_bias hold (a parameter's .grad, written where it lies) instead of
// writing over it.
void layer_norm_backward(const Tensor& x, const Tensor& g, const Tensor& weight, const Tensor& mean, const Tensor& rstd,
                         const Tensor& dx, const Tensor& dweight, const Tensor& dbias, const Tensor& g_sum = Tensor(),
                         const Tensor& dresidual = Tensor(), bool accumulate_dweight = false,
                         bool accumulate_dbias = false, const Tensor& dresidual_bias = Tensor(),
                         bool accumulate_dresidual_bias = false);

// Fused log-softmax + NLL over the logits [rows, C] (unit column stride, rows strides()[0]
// >= C apart) and the dense targets [rows] (i32/i64):
// stats [rows, 2] gets (max, log-sum) per row, loss (a scalar in the statistics dtype)
// the mean over the rows whose target is not ignore_index, valid_count (i64 scalar)
// their number. Synchronises once, to read back the target check (not while a CUDA
// graph is being captured: then a bad target only turns the loss into NaN).
BadIndex cross_entropy_forward(const Tensor& logits, const Tensor& targets, int64_t ignore_index, const Tensor& stats,
                               const Tensor& loss, const Tensor& valid_count);
// dlogits (the logits' dtype, dense [rows, width >= C]) = grad * (softmax - onehot) / valid_count,
// softmax recomputed from the logits and stats; zero rows where the target is ignored, and
// zeros in the columns past C (padding). grad: scalar on the device.
void cross_entropy_backward(const Tensor& logits, const Tensor& targets, int64_t ignore_index, const Tensor& stats,
                            const Tensor& valid_count, const Tensor& grad, const Tensor& dlogits);
// Both in one pass over the logits (the fused classifier): loss as cross_entropy_forward's,
// and dlogits = grad_factor * (softmax - onehot) / valid_count, grad_factor an f32 scalar on
// the device (the gradient the loss will receive: loss scale / micro-batches). dlogits may
// be the logits' own memory (rows `width` = ld apart). f16/bf16/f32 logits in 16-byte
// aligned rows take the fused kernel; others the forward and backward passes. Synchronises
// once to read back the target check, as cross_entropy_forward, before anything is written.
BadIndex cross_entropy_with_grad(const Tensor& logits, const Tensor& targets, int64_t ignore_index,
                                 const Tensor& grad_factor, const Tensor& loss, const Tensor& dlogits);

// out [N, C] = weight[indices[n], :]; weight [rows, C] with unit column stride; indices
// dense i32/i64. Synchronises once to read back the index check (as cross_entropy_forward).
BadIndex embedding_forward(const Tensor& weight, const Tensor& indices, const Tensor& out);
// dweight [rows, C] (dense) = scatter-add of grad_rows [N, C] (dense) by indices,
// deterministic: the indices are sorted, and each weight row sums its gradient rows in order.
void embedding_backward(const Tensor& grad_rows, const Tensor& indices, const Tensor& dweight);

}  // namespace precis::ops::cuda

#if defined(__CUDACC__)

#include <algorithm>
#include <limits>
#include <type_traits>

#include "ops/cuda/tensor_info.cuh"

namespace precis::ops::cuda {

// ---- packs of W elements (a power of two), moved by one aligned load or store: W =
// Packed128<T>::size makes a 16-byte pack; the same W for a wider type moves 2 of them, for a
// narrower one 4 or 8 bytes, so that arrays of mixed dtypes are visited with one W.

template <typename T, int W>
struct alignas(sizeof(T) * W) Pack {
  T v[W];
};

template <int W, typename T>
__device__ __forceinline__ Pack<T, W> load_pack(const T* p) {
  return *reinterpret_cast<const Pack<T, W>*>(p);
}
template <int W, typename T>
__device__ __forceinline__ void store_pack(T* p, const Pack<T, W>& value) {
  *reinterpret_cast<Pack<T, W>*>(p) = value;
}

// Pointers whose addresses agree modulo 16 bytes: their rows cross 16-byte boundaries at the same elements.
inline bool same_phase16(const void* a, const void* b) {
  return (reinterpret_cast<uintptr_t>(a) - reinterpret_cast<uintptr_t>(b)) % 16 == 0;
}

// Element arrays (of any two types) that reach a W-element pack boundary at the same index:
// a + i starts a Pack<A, W> exactly where b + i starts a Pack<B, W>. A null b agrees with any a.
template <int W, typename A, typename B>
bool same_pack_phase(const A* a, const B* b) {
  if (!b) return true;
  const auto ua = reinterpret_cast<uintptr_t>(a), ub = reinterpret_cast<uintptr_t>(b);
  return ua % sizeof(A) == 0 && ub % sizeof(B) == 0 && ua / sizeof(A) % W == ub / sizeof(B) % W;
}

// A null pointer, or one at which a Pack<T, W> may start.
template <int W, typename T>
bool pack_aligned(const T* p) {
  return reinterpret_cast<uintptr_t>(p) % (W * sizeof(T)) == 0;
}

template <int W>
using Width = std::integral_constant<int, W>;

// Visits a row of n elements starting at `row` (any alignment) with `threads` threads:
// op(i, Width<1>) for the elements before the first kPack-element pack boundary and after the
// last, op(i, Width<kPack>) for each aligned pack in between (16 bytes for kPack =
// Packed128<T>::size). Arrays in the same phase as `row` (same_phase16, same_pack_phase) can
// be loaded at i with the same width. kPack 1 visits element by element.
template <int kPack, typename T, typename Op>
__device__ __forceinline__ void for_each_in_row(const T* row, int64_t n, int tid, int threads, Op&& op) {
  if constexpr (kPack == 1) {
    for (int64_t i = tid; i < n; i += threads) op(i, Width<1>{});
  } else {
    const int64_t misaligned = static_cast<int64_t>(reinterpret_cast<uintptr_t>(row) / sizeof(T) % kPack);
    const int64_t head = misaligned == 0 ? 0 : std::min<int64_t>(n, kPack - misaligned);
    const int64_t packs = (n - head) / kPack;
    const int64_t tail = head + packs * kPack;
    if (tid < head) op(static_cast<int64_t>(tid), Width<1>{});
    for (int64_t p = tid; p < packs; p += threads) op(head + p * kPack, Width<kPack>{});
    for (int64_t i = tail + tid; i < n; i += threads) op(i, Width<1>{});
  }
}

// ---- deterministic reductions: a fixed shuffle and summation order, and every thread gets the result

template <typename A>
struct Pair {
  A first, second;
};

template <typename A>
__device__ __forceinline__ A shuffle_xor(A v, int mask) {
  return __shfl_xor_sync(0xffffffffu, v, mask);
}
template <typename A>
__device__ __forceinline__ Pair<A> shuffle_xor(Pair<A> v, int mask) {
  return {__shfl_xor_sync(0xffffffffu, v.first, mask), __shfl_xor_sync(0xffffffffu, v.second, mask)};
}

template <typename V, typename Op>
__device__ __forceinline__ V warp_all_reduce(V v, Op op) {
#pragma unroll
  for (int mask = 16; mask > 0; mask >>= 1) v = op(v, shuffle_xor(v, mask));
  return v;
}

// Reduces over a one-dimensional block of any multiple of 32 threads (at most 1024);
// every thread must call it.
template <typename V, typename Op>
__device__ __forceinline__ V block_all_reduce(V v, Op op) {
  __shared__ V partial[32];
  v = warp_all_reduce(v, op);
  const int warps = blockDim.x / 32;
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = v;
  __syncthreads();
  v = partial[0];
  for (int w = 1; w < warps; ++w) v = op(v, partial[w]);
  __syncthreads();  // partial is free for the next reduction
  return v;
}

// Reduces over the kThreads threads of a row group: a warp (kThreads 32, no shared
// memory, no barrier) or a whole block of kThreads (see dispatch_row_threads).
template <int kThreads, typename V, typename Op>
__device__ __forceinline__ V row_all_reduce(V v, Op op) {
  if constexpr (kThreads == 32)
    return warp_all_reduce(v, op);
  else
    return block_all_reduce(v, op);
}

struct SumOp {
  template <typename V>
  __device__ __forceinline__ V operator()(V a, V b) const {
    return a + b;
  }
  template <typename A>
  __device__ __forceinline__ Pair<A> operator()(Pair<A> a, Pair<A> b) const {
    return {a.first + b.first, a.second + b.second};
  }
};

// ---- online softmax statistics: (max m, sum s of exp(x - m)) of a set of values

// Folds x in. A -inf adds exp(-inf) = 0 and is skipped, so that -inf - -inf (NaN) is never formed.
template <typename A>
__device__ __forceinline__ void max_sum_add(Pair<A>& ms, A x) {
  if (x > ms.first) {
    ms.second = ms.second * ::exp(ms.first - x) + A(1);
    ms.first = x;
  } else if (x != -std::numeric_limits<A>::infinity()) {
    ms.second += ::exp(x - ms.first);
  }
}

struct MaxSumOp {
  template <typename A>
  __device__ __forceinline__ Pair<A> operator()(Pair<A> a, Pair<A> b) const {
    const A m = a.first > b.first ? a.first : b.first;
    if (m == -std::numeric_limits<A>::infinity()) return {m, A(0)};
    return {m, a.second * ::exp(a.first - m) + b.second * ::exp(b.first - m)};
  }
};

template <typename A>
__device__ __forceinline__ Pair<A> max_sum_identity() {
  return {-std::numeric_limits<A>::infinity(), A(0)};
}

// ---- row groups: a warp per row for short rows, a block per row for long ones

// Calls fn(std::integral_constant<int, kThreads>) with the threads that share one row of n values.
template <typename Fn>
void dispatch_row_threads(int64_t n, Fn&& fn) {
  if (n <= 1024) return fn(std::integral_constant<int, 32>{});
  if (n <= 16384) return fn(std::integral_constant<int, 256>{});
  return fn(std::integral_constant<int, 512>{});
}

// Block shape and grid for `rows` rows with kThreads threads per row: warps are stacked
// kWarpRowsPerBlock to a block (threadIdx.y picks the row), blocks take one row each.
inline constexpr int kWarpRowsPerBlock = 8;
template <int kThreads>
inline constexpr int kRowBlockThreads = kThreads == 32 ? 32 * kWarpRowsPerBlock : kThreads;
// __launch_bounds__ of a row kernel: at least 1024 threads resident per SM (at most 64 registers each).
#define PRECIS_ROW_LAUNCH_BOUNDS(kThreads) \
  __launch_bounds__(kRowBlockThreads<kThreads>, 1024 / kRowBlockThreads<kThreads>)
template <int kThreads>
dim3 row_block() {
  return kThreads == 32 ? dim3(32, kWarpRowsPerBlock) : dim3(kThreads, 1);
}
template <int kThreads>
unsigned row_grid(int64_t rows) {
  const int64_t per_block = kThreads == 32 ? kWarpRowsPerBlock : 1;
  return static_cast<unsigned>((rows + per_block - 1) / per_block);
}
__device__ __forceinline__ int64_t row_index() { return static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y; }

// ---- batched launches: one launch works on up to N tensors, whose table is a kernel argument

// The tensor block `block` works on: s with first_block[s] <= block < first_block[s + 1]
// (first_block ascending, first_block[0] = 0), by binary search over the count tensors.
__device__ __forceinline__ int tensor_of_block(const int64_t* first_block, int count, int64_t block) {
  int low = 0, high = count - 1;  // the answer is in [low, high]
  while (low < high) {
    const int mid = (low + high + 1) / 2;
    if (block >= first_block[mid]) {
      low = mid;
    } else {
      high = mid - 1;
    }
  }
  return low;
}

// ---- index checks on the device

// A one-word device flag holding the smallest bad position (atomicMin), ~0 when none.
__device__ __forceinline__ void flag_bad_position(unsigned long long* flag, int64_t position) {
  atomicMin(flag, static_cast<unsigned long long>(position));
}

// Clears `flag` (one unsigned long long on the device) on `stream`.
inline void clear_bad_position(unsigned long long* flag, cudaStream_t stream, const char* op) {
  PRECIS_CUDA_CHECK(cudaMemsetAsync(flag, 0xff, sizeof(unsigned long long), stream), op);
}

// Reads the flag back (one copy and one stream synchronisation) and, when set, the
// offending index from `indices` (dense i32/i64 on the device). While `stream` is
// being captured into a CUDA graph nothing can be read back; the check is skipped.
inline BadIndex read_bad_position(const unsigned long long* flag, const Tensor& indices, cudaStream_t stream,
                                  const char* op) {
  if (precis::cuda::is_capturing(stream)) return {};
  auto copy_back = [&](void* host, const void* device, size_t bytes) {
    PRECIS_CUDA_CHECK(cudaMemcpyAsync(host, device, bytes, cudaMemcpyDeviceToHost, stream), op);
    PRECIS_CUDA_CHECK(cudaStreamSynchronize(stream), op);
  };
  unsigned long long position = 0;
  copy_back(&position, flag, sizeof(position));
  if (position == ~0ull) return {};
  BadIndex bad{static_cast<int64_t>(position), 0};
  const char* at = static_cast<const char*>(indices.raw_data()) + bad.position * element_size(indices.dtype());
  if (indices.dtype() == DType::i32) {
    int32_t value = 0;
    copy_back(&value, at, sizeof(value));
    bad.value = value;
  } else {
    copy_back(&bad.value, at, sizeof(bad.value));
  }
  return bad;
}

}  // namespace precis::ops::cuda

#endif  // __CUDACC__
