// Device helpers the optimizer kernels share (optim/cuda/adamw.cu, sgd.cu): the step's
// numbers from device memory, the gradient factor, the rounding of an f32 result into a
// low-precision parameter (optim/low_precision.h's rules, on the device), and the
// kVec-element accesses both update kernels make.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "core/cuda/convert.cuh"
#include "core/philox.h"
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

}  // namespace precis::optim::cuda
