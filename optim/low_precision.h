// Low-precision (f16/bf16) parameters in the optimizers: the update runs in f32
// (on the f32 master copy when the optimizer keeps one) and the result is
// rounded back into the parameter, to nearest-even or stochastically. An f32 parameter
// with a 16-bit gradient (ZeRO-1's shard of a reduce in bf16, distributed/zero.h) takes
// the same path, the gradient widened as it is read and the result stored as it is.
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
#include "core/error.h"
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
// in-place scaling of the gradient would store it; g itself when the factor is 1. With
// `in_f32` a 16-bit g is rounded to f32 instead: g stands for an f32 gradient it was
// reduced from (StepInputs::round_scaled_grads_to_f32). The CUDA kernels read it alike
// (optim/cuda/step_kernels.cuh).
template <typename C, typename G>
inline C scaled_gradient(G g, double factor, bool in_f32 = false) {
  if (factor == 1.0) return convert<C>(g);
  const double scaled = convert<double>(g) * factor;
  if constexpr (sizeof(G) < sizeof(float)) {
    if (in_f32) return convert<C>(convert<float>(scaled));
  }
  return convert<C>(convert<G>(scaled));
}

// Checks the dtypes of parameter `index` and of its gradient for optimizer `op`: f32/f32 and
// f64/f64 take the plain loop; any other pair the mixed path (an f32 update of a 16-bit
// parameter or from a 16-bit gradient, dispatch_low_precision), which takes f32, f16 and bf16.
inline void check_step_dtypes(const char* op, size_t index, DType param, DType grad, bool stochastic_rounding) {
  const bool mixed = !(param == DType::f32 && grad == DType::f32) && !(param == DType::f64 && grad == DType::f64);
  if (!mixed) return;
  const auto f32_or_16bit = [](DType d) { return d == DType::f32 || is_low_precision(d); };
  PRECIS_CHECK(f32_or_16bit(param) && f32_or_16bit(grad), op, ": parameter ", index, " is ", param, " with a ", grad,
               " gradient; supported: float64 with a float64 gradient, float32/float16/bfloat16 with a float32, "
               "float16 or bfloat16 gradient");
  PRECIS_CHECK(!stochastic_rounding || param == DType::bf16 || param == DType::f32, op,
               ": stochastic_rounding is for bfloat16 parameters, but parameter ", index, " is ", param);
}

// Calls fn(TypeTag<P>{}, TypeTag<G>{}) for a parameter of dtype `param` and a gradient of
// dtype `grad`, each f32, f16 or bf16 (check_step_dtypes' mixed path).
template <typename Fn>
void dispatch_low_precision(DType param, DType grad, Fn&& fn) {
  auto with_grad = [&](auto param_tag) {
    if (grad == DType::f16) {
      fn(param_tag, TypeTag<half>{});
    } else if (grad == DType::bf16) {
      fn(param_tag, TypeTag<bfloat16>{});
    } else {
      fn(param_tag, TypeTag<float>{});
    }
  };
  if (param == DType::f16) {
    with_grad(TypeTag<half>{});
  } else if (param == DType::bf16) {
    with_grad(TypeTag<bfloat16>{});
  } else {
    with_grad(TypeTag<float>{});
  }
}

}  // namespace precis::optim
