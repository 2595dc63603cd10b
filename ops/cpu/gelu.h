// GELU, tanh approximation (GPT-2), on the CPU: the one formula of the gelu op's loops and of
// the fused linear kernels (ops/cpu/linear.cpp), so both give the same values.
//   gelu(z)  = 0.5 z (1 + t),  t = tanh(u),  u = k (z + c z^3),  k = sqrt(2/pi), c = 0.044715
//   gelu'(z) = 0.5 (1 + t) + 0.5 z (1 - t^2) k (1 + 3 c z^2)
//
// tanh in float is a rational function (Eigen's generic_fast_tanh_float, within a few ulp):
//   tanh(u) ~ u P(u^2) / Q(u^2),  P of degree 6 and Q of degree 3 in u^2, u clamped to
//   [-7.905, 7.905], where the quotient reaches 1 - 1 ulp; beyond |u| = 9, where float's
//   tanh rounds to +-1, exactly +-1. It is plain arithmetic, so the compiler vectorises the
//   loops that call it; std::tanh is a library call per value. double keeps std::tanh.
// Always inlined: left to itself GCC called gelu_derivative out of line from the gelu op's
// element loops (ops/elementwise_unary.cpp), one call per value, and those loops stayed scalar.
#pragma once

#include <algorithm>
#include <cmath>

namespace precis::ops::cpu {

template <typename C>
struct GeluConstants {
  static constexpr C k = static_cast<C>(0.7978845608028654);  // sqrt(2 / pi)
  static constexpr C c = static_cast<C>(0.044715);
};

[[gnu::always_inline]] inline float fast_tanh(float u) {
  const float x = std::min(std::max(u, -7.90531110763549805f), 7.90531110763549805f);
  const float x2 = x * x;
  float p = x2 * -2.76076847742355e-16f + 2.00018790482477e-13f;
  p = x2 * p + -8.60467152213735e-11f;
  p = x2 * p + 5.12229709037114e-08f;
  p = x2 * p + 1.48572235717979e-05f;
  p = x2 * p + 6.37261928875436e-04f;
  p = x2 * p + 4.89352455891786e-03f;
  float q = x2 * 1.19825839466702e-06f + 1.18534705686654e-04f;
  q = x2 * q + 2.26843463243900e-03f;
  q = x2 * q + 4.89352518554385e-03f;
  const float t = x * p / q;
  return u > 9.0f ? 1.0f : (u < -9.0f ? -1.0f : t);
}
inline double fast_tanh(double u) { return std::tanh(u); }

template <typename C>
[[gnu::always_inline]] inline C gelu(C z) {
  using K = GeluConstants<C>;
  return C(0.5) * z * (C(1) + fast_tanh(K::k * (z + K::c * z * z * z)));
}

template <typename C>
[[gnu::always_inline]] inline C gelu_derivative(C z) {
  using K = GeluConstants<C>;
  const C t = fast_tanh(K::k * (z + K::c * z * z * z));
  return C(0.5) * (C(1) + t) + C(0.5) * z * (C(1) - t * t) * K::k * (C(1) + C(3) * K::c * z * z);
}

}  // namespace precis::ops::cpu
