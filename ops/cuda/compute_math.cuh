// Math on the device in a kernel's compute type (core/cuda/convert.cuh's compute_t): the
// float functions for float, the double ones for double, so a template written once
// compiles to expf for f32/f16/bf16 data and to exp for f64.
#pragma once

#include <type_traits>

namespace precis::ops::cuda {

// Math in the compute type: the float functions for float, the double ones for double.
template <typename C>
__device__ __forceinline__ C exp_of(C v) {
  if constexpr (std::is_same_v<C, float>)
    return expf(v);
  else
    return ::exp(v);
}
// 2^x in one special-function instruction (ex2.approx.ftz: ~2 ulp; results below 2^-126
// flush to 0, far under what a 16-bit probability or an f32 sum of them can hold
// beside 1). exp2f adds a subnormal rescue of three more instructions per call.
__device__ __forceinline__ float exp2_fast(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}
template <typename C>
__device__ __forceinline__ C log_of(C v) {
  if constexpr (std::is_same_v<C, float>)
    return logf(v);
  else
    return ::log(v);
}
template <typename C>
__device__ __forceinline__ C sqrt_of(C v) {
  if constexpr (std::is_same_v<C, float>)
    return sqrtf(v);
  else
    return ::sqrt(v);
}
template <typename C>
__device__ __forceinline__ C tanh_of(C v) {
  if constexpr (std::is_same_v<C, float>)
    return tanhf(v);
  else
    return ::tanh(v);
}
template <typename C>
__device__ __forceinline__ C pow_of(C v, C e) {
  if constexpr (std::is_same_v<C, float>)
    return powf(v, e);
  else
    return ::pow(v, e);
}

// GELU, tanh approximation (the CPU's, ops/elementwise_unary.cpp, and cuBLASLt's GELU epilogues'):
//   gelu(z)  = 0.5 z (1 + tanh(u)),  u = k (z + c z^3),  k = sqrt(2/pi), c = 0.044715
//   gelu'(z) = 0.5 (1 + t) + 0.5 z (1 - t^2) k (1 + 3 c z^2),  t = tanh(u)
template <typename C>
struct GeluConstants {
  static constexpr C k = static_cast<C>(0.7978845608028654);  // sqrt(2 / pi)
  static constexpr C c = static_cast<C>(0.044715);
};

template <typename C>
__device__ __forceinline__ C gelu_tanh(C z) {
  using K = GeluConstants<C>;
  return C(0.5) * z * (C(1) + tanh_of(K::k * (z + K::c * z * z * z)));
}

template <typename C>
__device__ __forceinline__ C gelu_tanh_grad(C z) {
  using K = GeluConstants<C>;
  C t = tanh_of(K::k * (z + K::c * z * z * z));
  return C(0.5) * (C(1) + t) + C(0.5) * z * (C(1) - t * t) * K::k * (C(1) + C(3) * K::c * z * z);
}

}  // namespace precis::ops::cuda
