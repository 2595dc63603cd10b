// Low-precision (f16/bf16) parameters in the optimizers: the update runs in f32
// (on the f32 master copy when the optimizer keeps one) and the result is
// rounded back into the parameter, to nearest-even or stochastically.
//
// Stochastic rounding of an f32 value x to bf16 (bf16 is the top 16 bits of
// an f32): add 16 uniform random bits r to the low half of x's bit pattern and
// truncate. x = lower + f * ulp rounds up (away from zero) with probability f,
// so E[round(x)] = x: small updates survive on average instead of vanishing.
// The random bits come from Philox keyed by the seed, with the counter
// (element / 4, step << 32 | parameter index), so a run is reproducible for a
// seed on any number of threads and on the GPU.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

#include "core/convert.h"
#include "core/philox.h"

namespace precis::optim {

inline bool is_low_precision(DType dtype) { return dtype == DType::f16 || dtype == DType::bf16; }

// How the f32 result is stored into a low-precision parameter.
struct Rounding {
  bool stochastic = false;  // bf16 only
  uint64_t seed = 0;
  uint64_t step = 0;
  uint64_t param_index = 0;
};

// The 16 random bits for element i of a parameter's stochastic rounding.
inline uint32_t stochastic_rounding_bits(const Rounding& r, uint64_t i) {
  uint64_t counter_hi = (r.step << 32) | (r.param_index & 0xFFFFFFFFu);
  return philox4x32(i / 4, counter_hi, r.seed).x[i % 4] >> 16;
}

// bf16 bits of x rounded stochastically with `random16` (uniform in [0, 2^16)):
//   bits(x) + random16, then keep the top 16 bits. inf and NaN are kept as they are.
inline uint16_t bf16_bits_stochastic(float x, uint32_t random16) {
  uint32_t bits = std::bit_cast<uint32_t>(x);
  if (!std::isfinite(x)) return static_cast<uint16_t>((bits >> 16) | (std::isnan(x) ? 0x40u : 0u));
  return static_cast<uint16_t>((bits + random16) >> 16);
}

// x stored as P: nearest-even, or stochastic (bf16) for element i.
template <typename P>
inline P round_to(float x, const Rounding& r, uint64_t i) {
  if constexpr (std::is_same_v<P, bfloat16>) {
    if (r.stochastic) return Eigen::numext::bit_cast<bfloat16>(bf16_bits_stochastic(x, stochastic_rounding_bits(r, i)));
  }
  return convert<P>(x);
}

// A gradient element g as the step reads it, in the compute type C: times the step's
// gradient factor (StepInputs::grad_factor) in f64 and rounded back to g's dtype, as an
// in-place scaling of the gradient would store it; g itself when the factor is 1. The
// CUDA kernels read it alike (optim/cuda/low_precision.cuh).
template <typename C, typename G>
inline C scaled_gradient(G g, double factor) {
  if (factor == 1.0) return convert<C>(g);
  return convert<C>(convert<G>(convert<double>(g) * factor));
}

// Calls fn(TypeTag<P>{}, TypeTag<G>{}) for a low-precision parameter of dtype `param`
// whose gradient is f32 or of the parameter's own dtype.
template <typename Fn>
void dispatch_low_precision(DType param, DType grad, Fn&& fn) {
  auto with_grad = [&](auto param_tag) {
    using P = typename decltype(param_tag)::type;
    if (grad == DType::f32) {
      fn(param_tag, TypeTag<float>{});
    } else {
      fn(param_tag, TypeTag<P>{});
    }
  };
  if (param == DType::f16) {
    with_grad(TypeTag<half>{});
  } else {
    with_grad(TypeTag<bfloat16>{});
  }
}

}  // namespace precis::optim
