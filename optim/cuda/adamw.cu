// Fused AdamW on the GPU, in the manner of llm.c's adamw.cuh: one pass reads the
// parameter (or its f32 master copy), the gradient and both moments, and writes
// the moments and the parameter back. Per element, in the compute type C (f32,
// f64 for f64 parameters), exactly the CPU's formula (optim/adamw.cpp):
//   m <- b1 m + (1 - b1) g,   v <- b2 v + (1 - b2) g^2
//   x <- x (1 - lr wd) - (lr / bias1) m / (sqrt(v) / sqrt(bias2) + eps)
// x is the parameter, or for f16/bf16 parameters the f32 master copy when there is
// one (else the widened parameter); the parameter then gets x rounded to nearest
// even, or for bf16 stochastically.
// Bytes per element: param, grad, m, v read and param, m, v written, plus the
// master read and written when there is one (f32 parameters: 28 bytes).
//
// The step reads its numbers from device memory instead of kernel arguments: a
// one-thread kernel advances the step count t (unless the loss scaler flagged the
// step to be skipped) and computes
//   step_size = lr / (1 - b1^t),  inv_sqrt_bias2 = 1 / sqrt(1 - b2^t)
// in f64 as the host does, and the update kernel reads them (and returns at once
// on a skipped step). The gradient factor c (clip_grad_norm's clip / scale) is
// applied to each gradient as it is read, g <- G(double(g) c), so no separate pass
// over the gradients.
//
// Three further update kernels (issue 19, an A/B behind PRECIS_AB_ADAMW, optim/cuda/adamw.h)
// do the same math per element with the same rounding bits, for the slots without a master copy:
//   wide        8 elements a thread and step: 16-byte loads and stores of every array (the old
//               kernel's vector path stores element by element: 12 stores of 2 or 4 bytes a
//               thread and step, each warp's touching every sector of its span in part), two
//               Philox draws, streaming hints (ld.global.cs / st.global.cs: each byte is
//               touched once);
//   wide_plain  wide without the hints;
//   pipe        wide, with step k + 1's loads issued into a second set of registers before step
//               k's math and stores, so a thread's loads are in flight while it computes;
//   wide_grid   wide in a grid of the resident blocks only, each looping over its chunks (no
//               tail wave, one start-up a block).
// Why, and the instructions each executes an element: bench/NOTES.md.
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <map>
#include <string>
#include <tuple>

#include "core/cuda/launch.cuh"
#include "core/cuda/tensor_batch.cuh"
#include "optim/cuda/adamw.h"
#include "optim/cuda/step_kernels.cuh"

namespace precis::optim::cuda {

using precis::cuda::compute_t;
using precis::cuda::stream_for;
using precis::cuda::tensor_of_block;

namespace {

constexpr int kThreads = 256;
constexpr int kVec = 4;                                   // elements per thread and step: one Philox draw
constexpr int64_t kChunk = int64_t{kThreads} * kVec * 8;  // elements per block

template <typename T>
struct alignas(sizeof(T) * kVec) Vec {
  T v[kVec];
};

template <typename P, typename G, typename C>
struct AdamWSlot {
  P* param;
  const G* grad;
  C* m;
  C* v;
  float* master;  // f16/bf16 parameters with master weights, else null
  int64_t n;
  double weight_decay;
  uint32_t index;   // the parameter's index in the optimizer
  bool vectorized;  // every array aligned for kVec-element accesses
};

template <typename P, typename G, typename C>
using AdamWBatch = precis::cuda::TensorBatch<AdamWSlot<P, G, C>, kAdamWBatch>;
// Kernel arguments may total 32764 bytes (the constants and a pointer travel beside the batch).
static_assert(sizeof(AdamWBatch<double, double, double>) <= 32764 - 256, "AdamW batch too large for a kernel argument");

template <typename C>
struct AdamWConstants {
  C step_size, inv_sqrt_bias2, b1, b2, eps;
  bool stochastic;
  uint64_t seed, step;
};

// The step's numbers (begin_device_step) and AdamW's bias corrections, computed on the device.
struct AdamWDeviceStep {
  DeviceStep base;
  double step_size, inv_sqrt_bias2;
};

// t <- t + 1 and the bias corrections, as optim/adamw.cpp computes them; nothing on a skipped step.
__global__ void adamw_prepare_kernel(DeviceStepInputs in, double beta1, double beta2, AdamWDeviceStep* out) {
  precis::cuda::wait_for_previous_grid();
  precis::cuda::allow_next_grid_to_start();
  begin_device_step(in, out->base);
  if (out->base.skip) return;
  const double t = static_cast<double>(out->base.step);
  const double bias1 = 1.0 - pow(beta1, t);
  const double bias2 = 1.0 - pow(beta2, t);
  out->step_size = out->base.lr / bias1;
  out->inv_sqrt_bias2 = 1.0 / sqrt(bias2);
}

// Products and sums each rounded on their own (the _rn intrinsics are never fused into a
// multiply-add), as the host computes them: otherwise the compiler may fuse differently in
// each instantiation, and a bf16 gradient would not step as its f32 widening does.
__device__ __forceinline__ float mul_rn(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double mul_rn(double a, double b) { return __dmul_rn(a, b); }
__device__ __forceinline__ float add_rn(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ double add_rn(double a, double b) { return __dadd_rn(a, b); }
__device__ __forceinline__ float sub_rn(float a, float b) { return __fsub_rn(a, b); }
__device__ __forceinline__ double sub_rn(double a, double b) { return __dsub_rn(a, b); }

//   m <- b1 m + (1 - b1) g;  v <- b2 v + (1 - b2) g^2
//   x <- x (1 - lr wd) - (lr / bias1) m / (sqrt(v) / sqrt(bias2) + eps)
template <typename C>
__device__ __forceinline__ C adamw_element(C x, C g, C& m, C& v, C decay, const AdamWConstants<C>& c) {
  m = add_rn(mul_rn(c.b1, m), mul_rn(sub_rn(C(1), c.b1), g));
  v = add_rn(mul_rn(c.b2, v), mul_rn(mul_rn(sub_rn(C(1), c.b2), g), g));
  const C denominator = add_rn(mul_rn(C(::sqrt(v)), c.inv_sqrt_bias2), c.eps);
  return sub_rn(mul_rn(x, decay), mul_rn(c.step_size, m) / denominator);
}

// Block b updates elements [chunk * kChunk, + kChunk) of its tensor, kVec at a time, with
// the step's numbers from `device` (the constants in `host` fill in the rest).
template <typename P, typename G, typename C>
__global__ void __launch_bounds__(kThreads) adamw_kernel(const __grid_constant__ AdamWBatch<P, G, C> batch,
                                                         const AdamWConstants<C> host, const AdamWDeviceStep* device) {
  precis::cuda::wait_for_previous_grid();
  precis::cuda::allow_next_grid_to_start();
  if (device->base.skip) return;
  const int s = tensor_of_block(batch.first_block, batch.count, blockIdx.x);
  const AdamWSlot<P, G, C>& t = batch.slot[s];
  AdamWConstants<C> c = host;
  c.step_size = static_cast<C>(device->step_size);
  c.inv_sqrt_bias2 = static_cast<C>(device->inv_sqrt_bias2);
  c.step = device->base.step;
  const double factor = device->base.grad_factor;
  const bool in_f32 = device->base.grad_in_f32;
  const C decay =
      static_cast<C>(__dsub_rn(1.0, __dmul_rn(device->base.lr, t.weight_decay)));  // no fused multiply-add: as the host
  const int64_t start = (blockIdx.x - batch.first_block[s]) * kChunk;
  const int64_t end = start + kChunk < t.n ? start + kChunk : t.n;
  for (int64_t i = start + threadIdx.x * kVec; i < end; i += int64_t{kThreads} * kVec) {
    const bool stochastic = std::is_same_v<P, __nv_bfloat16> && c.stochastic;
    const Philox4 bits = stochastic ? rounding_bits(i / 4, t.index, c.step, c.seed) : Philox4{};
    if (t.vectorized && i + kVec <= end) {
      Vec<P> p = *reinterpret_cast<const Vec<P>*>(t.param + i);
      const Vec<G> g = *reinterpret_cast<const Vec<G>*>(t.grad + i);
      Vec<C> m = *reinterpret_cast<const Vec<C>*>(t.m + i);
      Vec<C> v = *reinterpret_cast<const Vec<C>*>(t.v + i);
      Vec<float> master;
      if (t.master) master = *reinterpret_cast<const Vec<float>*>(t.master + i);
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        const C x = t.master ? C(master.v[k]) : convert_to<C>(p.v[k]);
        const C updated = adamw_element(x, scaled_gradient<C>(g.v[k], factor, in_f32), m.v[k], v.v[k], decay, c);
        if (t.master) master.v[k] = static_cast<float>(updated);
        p.v[k] = store_param<P>(updated, stochastic, bits.x[k]);
      }
      *reinterpret_cast<Vec<P>*>(t.param + i) = p;
      *reinterpret_cast<Vec<C>*>(t.m + i) = m;
      *reinterpret_cast<Vec<C>*>(t.v + i) = v;
      if (t.master) *reinterpret_cast<Vec<float>*>(t.master + i) = master;
    } else {
      for (int64_t j = i; j < i + kVec && j < end; ++j) {
        const C x = t.master ? C(t.master[j]) : convert_to<C>(t.param[j]);
        const C updated = adamw_element(x, scaled_gradient<C>(t.grad[j], factor, in_f32), t.m[j], t.v[j], decay, c);
        if (t.master) t.master[j] = static_cast<float>(updated);
        t.param[j] = store_param<P>(updated, stochastic, bits.x[j % 4]);
      }
    }
  }
}

constexpr int kWide = 8;       // elements per thread and step of the wide kernels: two Philox draws
constexpr int kWideSteps = 8;  // steps per thread in a block
constexpr int64_t kWideChunk = int64_t{kThreads} * kWide * kWideSteps;  // elements per block

// kWide consecutive values of T, moved as 16-byte accesses (each array 16-byte aligned), with
// kStreaming as streaming ones (ld.global.cs / st.global.cs: evict first).
template <typename T>
struct alignas(16) Wide {
  static constexpr int kWords = static_cast<int>(sizeof(T)) * kWide / 16;
  T v[kWide];
};

template <bool kStreaming, typename T>
__device__ __forceinline__ void load_wide(Wide<T>& out, const T* p) {
#pragma unroll
  for (int w = 0; w < Wide<T>::kWords; ++w) {
    const uint4* from = reinterpret_cast<const uint4*>(p) + w;
    reinterpret_cast<uint4*>(out.v)[w] = kStreaming ? __ldcs(from) : *from;
  }
}

template <bool kStreaming, typename T>
__device__ __forceinline__ void store_wide(T* p, const Wide<T>& x) {
#pragma unroll
  for (int w = 0; w < Wide<T>::kWords; ++w) {
    uint4* to = reinterpret_cast<uint4*>(p) + w;
    const uint4 word = reinterpret_cast<const uint4*>(x.v)[w];
    if constexpr (kStreaming)
      __stcs(to, word);
    else
      *to = word;
  }
}

// One thread's step: elements [i, i + kWide) of a slot.
template <typename P, typename G, typename C>
struct AdamWTile {
  Wide<P> p;
  Wide<G> g;
  Wide<C> m, v;
};

template <bool kStreaming, typename P, typename G, typename C>
__device__ __forceinline__ void load_tile(AdamWTile<P, G, C>& tile, const AdamWSlot<P, G, C>& t, int64_t i) {
  load_wide<kStreaming>(tile.p, t.param + i);
  load_wide<kStreaming>(tile.g, t.grad + i);
  load_wide<kStreaming>(tile.m, t.m + i);
  load_wide<kStreaming>(tile.v, t.v + i);
}

// The rounding words of elements i .. i + 7 (i a multiple of 4): the draws of i / 4 and
// i / 4 + 1, the ones the old kernel makes for the two halves.
struct RoundingWords {
  Philox4 half[2];
};

__device__ __forceinline__ RoundingWords rounding_words(bool stochastic, int64_t i, bool both, uint32_t index,
                                                        uint64_t step, uint64_t seed) {
  RoundingWords r{};
  if (stochastic) {
    r.half[0] = rounding_bits(i / 4, index, step, seed);
    if (both) r.half[1] = rounding_bits(i / 4 + 1, index, step, seed);
  }
  return r;
}

// Updates a loaded tile at i and stores it.
template <bool kStreaming, typename P, typename G, typename C>
__device__ __forceinline__ void update_tile(AdamWTile<P, G, C>& tile, const AdamWSlot<P, G, C>& t, int64_t i,
                                            bool stochastic, double factor, bool in_f32, C decay,
                                            const AdamWConstants<C>& c) {
  const RoundingWords bits = rounding_words(stochastic, i, true, t.index, c.step, c.seed);
#pragma unroll
  for (int k = 0; k < kWide; ++k) {
    const C updated = adamw_element(convert_to<C>(tile.p.v[k]), scaled_gradient<C>(tile.g.v[k], factor, in_f32),
                                    tile.m.v[k], tile.v.v[k], decay, c);
    tile.p.v[k] = store_param<P>(updated, stochastic, bits.half[k / 4].x[k % 4]);
  }
  store_wide<kStreaming>(t.param + i, tile.p);
  store_wide<kStreaming>(t.m + i, tile.m);
  store_wide<kStreaming>(t.v + i, tile.v);
}

// Elements [i, end) (fewer than kWide, or an array not 16-byte aligned) one at a time.
template <typename P, typename G, typename C>
__device__ __forceinline__ void update_elements(const AdamWSlot<P, G, C>& t, int64_t i, int64_t end, bool stochastic,
                                                double factor, bool in_f32, C decay, const AdamWConstants<C>& c) {
  const RoundingWords bits = rounding_words(stochastic, i, i + 4 < end, t.index, c.step, c.seed);
#pragma unroll
  for (int k = 0; k < kWide; ++k) {
    const int64_t j = i + k;
    if (j < end) {
      const C updated = adamw_element(convert_to<C>(t.param[j]), scaled_gradient<C>(t.grad[j], factor, in_f32), t.m[j],
                                      t.v[j], decay, c);
      t.param[j] = store_param<P>(updated, stochastic, bits.half[k / 4].x[k % 4]);
    }
  }
}

// adamw_kernel's update, kWide elements a thread and step, for slots without a master copy;
// chunk b of the launch is elements [(b - first_block[s]) * kWideChunk, + kWideChunk) of its
// tensor s; block x takes chunk x, or with kGridStride chunks x, x + gridDim.x, ... (a grid of
// the resident blocks). With kPipelined, step k + 1's tile is loaded before step k's is
// updated and stored; with kStreaming, the tiles move with streaming hints.
template <typename P, typename G, typename C, bool kPipelined, bool kStreaming, bool kGridStride = false>
__global__ void __launch_bounds__(kThreads)
    adamw_wide_kernel(const __grid_constant__ AdamWBatch<P, G, C> batch, const AdamWConstants<C> host,
                      const AdamWDeviceStep* device) {
  precis::cuda::wait_for_previous_grid();
  precis::cuda::allow_next_grid_to_start();
  if (device->base.skip) return;
  AdamWConstants<C> c = host;
  c.step_size = static_cast<C>(device->step_size);
  c.inv_sqrt_bias2 = static_cast<C>(device->inv_sqrt_bias2);
  c.step = device->base.step;
  const double factor = device->base.grad_factor;
  const bool in_f32 = device->base.grad_in_f32;
  const double lr = device->base.lr;
  const bool stochastic = std::is_same_v<P, __nv_bfloat16> && c.stochastic;
  const auto update_chunk = [&](int64_t chunk) {
    const int s = tensor_of_block(batch.first_block, batch.count, chunk);
    const AdamWSlot<P, G, C>& t = batch.slot[s];
    const C decay = static_cast<C>(__dsub_rn(1.0, __dmul_rn(lr, t.weight_decay)));
    const int64_t start = (chunk - batch.first_block[s]) * kWideChunk;
    const int64_t end = start + kWideChunk < t.n ? start + kWideChunk : t.n;
    constexpr int64_t kStride = int64_t{kThreads} * kWide;
    int64_t i = start + threadIdx.x * kWide;
    AdamWTile<P, G, C> tile;
    if (kPipelined && t.vectorized && i + kWide <= end) load_tile<kStreaming>(tile, t, i);
    for (; i < end; i += kStride) {
      const bool whole = t.vectorized && i + kWide <= end;
      if constexpr (kPipelined) {
        AdamWTile<P, G, C> next;
        if (t.vectorized && i + kStride + kWide <= end) load_tile<kStreaming>(next, t, i + kStride);
        if (whole)
          update_tile<kStreaming>(tile, t, i, stochastic, factor, in_f32, decay, c);
        else
          update_elements(t, i, end < i + kWide ? end : i + kWide, stochastic, factor, in_f32, decay, c);
        tile = next;
      } else {
        if (whole) {
          load_tile<kStreaming>(tile, t, i);
          update_tile<kStreaming>(tile, t, i, stochastic, factor, in_f32, decay, c);
        } else {
          update_elements(t, i, end < i + kWide ? end : i + kWide, stochastic, factor, in_f32, decay, c);
        }
      }
    }
  };
  if constexpr (kGridStride) {
    for (int64_t chunk = blockIdx.x; chunk < batch.first_block[batch.count]; chunk += gridDim.x) update_chunk(chunk);
  } else {
    update_chunk(blockIdx.x);
  }
}

// The blocks of `kernel` (kThreads each) resident on the current device at once: a grid of
// that many takes every chunk in a single wave, each block looping over its share.
template <typename Kernel>
int64_t resident_blocks(Kernel kernel, const char* op) {
  int device = 0, sms = 0, per_sm = 0;
  PRECIS_CUDA_CHECK(cudaGetDevice(&device), op);
  PRECIS_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), op);
  PRECIS_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, 0), op);
  return int64_t{std::max(per_sm, 1)} * sms;
}

template <typename T>
bool vec_aligned(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % (sizeof(T) * kVec) == 0;
}

bool wide_aligned(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Updates `params` (one device; parameter type P, gradient type G) kAdamWBatch at a time,
// with the step's numbers at `device` (made by adamw_prepare_kernel), by `kernel`'s update
// kernel; the old one where a parameter has a master copy.
template <typename P, typename G>
void adamw_launch(const std::vector<const AdamWTensors*>& params, const AdamWHyper& hyper,
                  const AdamWDeviceStep* device, AdamWKernel kernel) {
  using C = compute_t<P>;
  const char* op = "AdamW";
  cudaStream_t stream = stream_for(params.front()->param);
  for (const AdamWTensors* a : params)
    if (a->master.defined()) kernel = AdamWKernel::old;
  const int64_t chunk = kernel == AdamWKernel::old ? kChunk : kWideChunk;
  AdamWConstants<C> c{};  // step_size, inv_sqrt_bias2 and step come from `device`
  c.b1 = static_cast<C>(hyper.beta1);
  c.b2 = static_cast<C>(hyper.beta2);
  c.eps = static_cast<C>(hyper.eps);
  c.stochastic = hyper.stochastic_rounding;
  c.seed = hyper.seed;
  for (size_t first = 0; first < params.size(); first += kAdamWBatch) {
    AdamWBatch<P, G, C> batch{};
    batch.count = static_cast<int>(std::min<size_t>(kAdamWBatch, params.size() - first));
    for (int s = 0; s < batch.count; ++s) {
      const AdamWTensors& a = *params[first + s];
      AdamWSlot<P, G, C>& slot = batch.slot[s];
      slot.param = static_cast<P*>(a.param.raw_data());
      slot.grad = static_cast<const G*>(a.grad.raw_data());
      slot.m = static_cast<C*>(a.exp_avg.raw_data());
      slot.v = static_cast<C*>(a.exp_avg_sq.raw_data());
      slot.master = a.master.defined() ? static_cast<float*>(a.master.raw_data()) : nullptr;
      slot.n = a.param.numel();
      slot.weight_decay = a.weight_decay;
      slot.index = static_cast<uint32_t>(a.index);
      if (kernel == AdamWKernel::old)
        slot.vectorized = vec_aligned<P>(slot.param) && vec_aligned<G>(slot.grad) && vec_aligned<C>(slot.m) &&
                          vec_aligned<C>(slot.v) && (!slot.master || vec_aligned<float>(slot.master));
      else
        slot.vectorized =
            wide_aligned(slot.param) && wide_aligned(slot.grad) && wide_aligned(slot.m) && wide_aligned(slot.v);
      batch.first_block[s + 1] = batch.first_block[s] + (slot.n + chunk - 1) / chunk;
    }
    const int64_t blocks = batch.first_block[batch.count];
    if (blocks == 0) continue;
    PRECIS_CHECK(blocks <= INT32_MAX, op, ": ", blocks, " blocks in one launch");
    const unsigned grid = static_cast<unsigned>(blocks);
    if (kernel == AdamWKernel::wide)
      precis::cuda::launch(adamw_wide_kernel<P, G, C, false, true>, grid, kThreads, 0, stream, batch, c, device);
    else if (kernel == AdamWKernel::wide_grid)
      precis::cuda::launch(
          adamw_wide_kernel<P, G, C, false, true, true>,
          static_cast<unsigned>(std::min(blocks, resident_blocks(adamw_wide_kernel<P, G, C, false, true, true>, op))),
          kThreads, 0, stream, batch, c, device);
    else if (kernel == AdamWKernel::wide_plain)
      precis::cuda::launch(adamw_wide_kernel<P, G, C, false, false>, grid, kThreads, 0, stream, batch, c, device);
    else if (kernel == AdamWKernel::pipe)
      precis::cuda::launch(adamw_wide_kernel<P, G, C, true, true>, grid, kThreads, 0, stream, batch, c, device);
    else
      precis::cuda::launch(adamw_kernel<P, G, C>, grid, kThreads, 0, stream, batch, c, device);
    PRECIS_CUDA_CHECK_LAUNCH(op);
  }
}

// One launch sequence per (device, parameter dtype, gradient dtype), in parameter order.
void launch_all(const std::vector<AdamWTensors>& params, const AdamWHyper& step, const AdamWDeviceStep* device_step) {
  const AdamWKernel kernel = adamw_update_kernel();
  std::map<std::tuple<int, DType, DType>, std::vector<const AdamWTensors*>> groups;
  for (const AdamWTensors& a : params) groups[{a.param.device().index, a.param.dtype(), a.grad.dtype()}].push_back(&a);
  for (const auto& [key, group] : groups) {
    const auto [device, param, grad] = key;
    if (param == DType::f32 && grad == DType::f32)
      adamw_launch<float, float>(group, step, device_step, kernel);
    else if (param == DType::f64 && grad == DType::f64)
      adamw_launch<double, double>(group, step, device_step, kernel);
    else if (param == DType::f32 && grad == DType::bf16)
      adamw_launch<float, __nv_bfloat16>(group, step, device_step, kernel);
    else if (param == DType::f32 && grad == DType::f16)
      adamw_launch<float, __half>(group, step, device_step, kernel);
    else if (param == DType::f16 && grad == DType::f32)
      adamw_launch<__half, float>(group, step, device_step, kernel);
    else if (param == DType::f16 && grad == DType::f16)
      adamw_launch<__half, __half>(group, step, device_step, kernel);
    else if (param == DType::f16 && grad == DType::bf16)
      adamw_launch<__half, __nv_bfloat16>(group, step, device_step, kernel);
    else if (param == DType::bf16 && grad == DType::f32)
      adamw_launch<__nv_bfloat16, float>(group, step, device_step, kernel);
    else if (param == DType::bf16 && grad == DType::bf16)
      adamw_launch<__nv_bfloat16, __nv_bfloat16>(group, step, device_step, kernel);
    else if (param == DType::bf16 && grad == DType::f16)
      adamw_launch<__nv_bfloat16, __half>(group, step, device_step, kernel);
    else
      PRECIS_FAIL("AdamW: no CUDA kernel for ", param, " parameters with ", grad, " gradients");
  }
}

std::atomic<int> g_adamw_kernel{-1};  // an AdamWKernel, or -1 until read from the environment

}  // namespace

void set_adamw_update_kernel(AdamWKernel kernel) { g_adamw_kernel = static_cast<int>(kernel); }

AdamWKernel adamw_update_kernel() {
  int kernel = g_adamw_kernel.load(std::memory_order_relaxed);
  if (kernel < 0) {
    const char* setting = std::getenv("PRECIS_AB_ADAMW");
    const std::string name = setting != nullptr ? setting : "";
    AdamWKernel chosen = AdamWKernel::wide;
    if (name == "old")
      chosen = AdamWKernel::old;
    else if (name == "pipe")
      chosen = AdamWKernel::pipe;
    else if (name == "wide_plain")
      chosen = AdamWKernel::wide_plain;
    else if (name == "wide_grid")
      chosen = AdamWKernel::wide_grid;
    else
      PRECIS_CHECK(name.empty() || name == "wide",
                   "PRECIS_AB_ADAMW: expected old, wide, wide_plain, wide_grid or pipe, got '", name, "'");
    int unset = -1;
    g_adamw_kernel.compare_exchange_strong(unset, static_cast<int>(chosen));
    kernel = g_adamw_kernel.load();
  }
  return static_cast<AdamWKernel>(kernel);
}

void adamw_step(const std::vector<AdamWTensors>& params, const AdamWHyper& hyper, const DeviceStepInputs& inputs) {
  const char* op = "AdamW";
  if (params.empty()) return;
  PRECIS_CHECK(inputs.lr != nullptr && inputs.step != nullptr, op, ": the step needs lr and step on the device");
  const Device device = params.front().param.device();
  for (const AdamWTensors& a : params)
    PRECIS_CHECK(a.param.device() == device, op, ": one step updates parameters of one GPU, got ", device, " and ",
                 a.param.device());
  // The step's numbers: made on the device, read by every launch, freed once they are queued
  // (a later request on the compute stream runs after them).
  Tensor numbers = empty({static_cast<int64_t>((sizeof(AdamWDeviceStep) + 7) / 8)}, DType::f64, device);
  AdamWDeviceStep* device_step = static_cast<AdamWDeviceStep*>(numbers.raw_data());
  precis::cuda::launch(adamw_prepare_kernel, 1, 1, 0, stream_for(params.front().param), inputs, hyper.beta1,
                       hyper.beta2, device_step);
  PRECIS_CUDA_CHECK_LAUNCH(op);
  launch_all(params, hyper, device_step);
}

}  // namespace precis::optim::cuda
