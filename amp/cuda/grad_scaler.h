// The GPU half of GradScaler (plain C++ declarations): the scaler's ops on its
// state tensor (f64 [kScalerSlots], amp/scaler_state.h) beside the gradients. No copy
// back, no sync: capturable into a CUDA graph.
#pragma once

#include "amp/scaler_state.h"
#include "core/tensor.h"

namespace precis::amp::cuda {

// g[i] *= inv_scale with inv_scale = 1 / state[kScale] computed on the device (rounded to
// f32 for f32/f16/bf16 gradients, f64 for f64 ones, as the CPU loop); sets state[kFoundInf]
// to 1 when any element was inf or NaN.
void unscale_(const Tensor& grad, const Tensor& state);
// advance_scaler_state on the device, one thread, then the new scale rounded to f32 into
// scale_f32 (the factor the loss is multiplied by).
void update_(const Tensor& state, const Tensor& scale_f32, const ScalerRule& rule);

}  // namespace precis::amp::cuda
