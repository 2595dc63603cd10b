// The rule that turns the sum of squares of the (loss-scaled) gradients into the
// grad norm, the gradient factor and the overflow flag, written once for the CPU
// (optim/clip_grad.cpp) and the one-thread CUDA kernel (optim/cuda/grad_norm.cu).
//
// The gradients hold g * scale. Squares of f32/f16/bf16 values summed in f64 cannot
// overflow, so the sum is finite exactly when every element is: it does the loss
// scaler's inf/NaN check. With s = scale:
//   norm      = sqrt(sum) / s when finite, else +inf        (the norm of the unscaled g)
//   factor    = clip / s, clip = max_norm / (norm + 1e-6) when max_norm > 0, the norm is
//               finite and above max_norm, else 1          (takes each element to its
//                                                            clipped, unscaled value)
//   found_inf = finite ? 0 : 1
#pragma once

#include <cfloat>
#include <cmath>

#include "core/philox.h"  // PRECIS_HOST_DEVICE

namespace precis::optim {

struct GradNorm {
  double norm, factor, found_inf;
};

PRECIS_HOST_DEVICE inline GradNorm grad_norm_from_sum(double sum, double max_norm, double scale) {
  const bool finite = sum <= DBL_MAX;  // false for +inf and NaN
  const double norm = finite ? sqrt(sum) / scale : HUGE_VAL;
  const double clip = max_norm > 0 && finite && norm > max_norm ? max_norm / (norm + 1e-6) : 1.0;
  return {norm, clip / scale, finite ? 0.0 : 1.0};
}

}  // namespace precis::optim
