// Device helpers the optimizer kernels share (optim/cuda/adamw.cu, sgd.cu): the step's
// numbers from device memory, the gradient factor, the rounding of an f32 result into a
// low-precision parameter (optim/low_precision.h's rules, on the device), and the
// kVec-element accesses both update kernels make.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "core/cuda/convert.cuh"
#include "core/philox.h"
#include "core/tensor.h"
#include "optim/cuda/step_inputs.h"

namespace precis::optim::cuda {

using precis::cuda::convert_to;

// Elements a thread reads and writes at a time (one Philox draw gives their 4 rounding words),
// as one 8 to 32-byte access per array when the array is aligned for it.
constexpr int kVec = 4;

template <typename T>
struct alignas(sizeof(T) * kVec) Vec {
  T v[kVec];
};

// Whether `p` (an array of T) is aligned for Vec<T> accesses.
template <typename T>
bool vec_aligned(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % (sizeof(T) * kVec) == 0;
}

// The step's numbers, read once by a one-thread kernel before the update kernels.
struct DeviceStep {
  double lr, grad_factor;
  uint64_t step;
  int skip;
  bool grad_in_f32;  // DeviceStepInputs::round_scaled_grads_to_f32
};

// t <- t + 1 unless the step is skipped (Optimizer::begin_cpu_step on the CPU); the rest of
// `out` is set only for a step that is not skipped.
__device__ __forceinline__ void begin_device_step(const DeviceStepInputs& in, DeviceStep& out) {
  out.skip = in.skip != nullptr && *in.skip != 0;
  if (out.skip) return;
  out.step = static_cast<uint64_t>(++*in.step);
  out.lr = *in.lr;
  out.grad_factor = in.grad_factor != nullptr ? *in.grad_factor : 1.0;
  out.grad_in_f32 = in.round_scaled_grads_to_f32;
}

// A gradient element in the compute type C, times the factor first when it is not 1 (rounded
// to G as an in-place scaling would store it, or a 16-bit G to f32 with `in_f32`:
// optim/low_precision.h's scaled_gradient).
template <typename C, typename G>
__device__ __forceinline__ C scaled_gradient(G g, double factor, bool in_f32) {
  if (factor == 1.0) return convert_to<C>(g);
  const double scaled = convert_to<double>(g) * factor;
  if constexpr (sizeof(G) < sizeof(float)) {
    if (in_f32) return convert_to<C>(convert_to<float>(scaled));
  }
  return convert_to<C>(convert_to<G>(scaled));
}

// bf16 bits of x rounded stochastically: add 16 random bits below the kept half and
// truncate (optim/low_precision.h's bf16_bits_stochastic); inf and NaN are kept.
__device__ __forceinline__ __nv_bfloat16 bf16_stochastic(float x, uint32_t random16) {
  const uint32_t bits = __float_as_uint(x);
  __nv_bfloat16_raw raw;
  if (!isfinite(x))
    raw.x = static_cast<uint16_t>((bits >> 16) | (isnan(x) ? 0x40u : 0u));
  else
    raw.x = static_cast<uint16_t>((bits + random16) >> 16);
  return raw;
}

// The 4 stochastic-rounding words of elements 4q .. 4q + 3 of a parameter.
__device__ __forceinline__ Philox4 rounding_bits(uint64_t q, uint32_t index, uint64_t step, uint64_t seed) {
  return philox4x32(q, (step << 32) | index, seed);
}

// x stored as P: nearest-even, or for bf16 with `stochastic` the top half of random_word.
template <typename P, typename C>
__device__ __forceinline__ P store_param(C x, bool stochastic, uint32_t random_word) {
  if constexpr (std::is_same_v<P, __nv_bfloat16>) {
    if (stochastic) return bf16_stochastic(x, random_word >> 16);
  }
  return convert_to<P>(x);
}

// A compute copy (Optimizer::set_compute_copies): an f32 parameter's new value rounded to
// nearest even into f16 or bf16, as a cast rounds it. Null data: none.
struct ComputeCopy {
  void* data = nullptr;
  bool bf16 = true;  // else f16
};

// The kernels' view of a compute copy tensor (undefined: none).
inline ComputeCopy compute_copy_of(const Tensor& copy) {
  if (!copy.defined()) return {};
  return {copy.raw_data(), copy.dtype() == DType::bf16};
}

// Element i of the copy.
__device__ __forceinline__ void store_copy(const ComputeCopy& c, int64_t i, float x) {
  if (c.bf16)
    static_cast<__nv_bfloat16*>(c.data)[i] = convert_to<__nv_bfloat16>(x);
  else
    static_cast<__half*>(c.data)[i] = convert_to<__half>(x);
}

// Elements i .. i + kVec - 1 of the copy, in one access (the copy aligned for it).
template <typename T>
__device__ __forceinline__ void store_copy_vec(void* data, int64_t i, const Vec<float>& x) {
  Vec<T> out;
#pragma unroll
  for (int k = 0; k < kVec; ++k) out.v[k] = convert_to<T>(x.v[k]);
  *reinterpret_cast<Vec<T>*>(static_cast<T*>(data) + i) = out;
}
__device__ __forceinline__ void store_copy(const ComputeCopy& c, int64_t i, const Vec<float>& x) {
  if (c.bf16)
    store_copy_vec<__nv_bfloat16>(c.data, i, x);
  else
    store_copy_vec<__half>(c.data, i, x);
}

}  // namespace precis::optim::cuda
