// clip_grad_norm: the global L2 norm of all gradients, and scaling them down
// when it exceeds max_norm (as torch.nn.utils.clip_grad_norm_):
//   total = sqrt(sum_i ||g_i||^2);  if total > max_norm: g_i *= max_norm / (total + 1e-6)
#pragma once

#include <vector>

#include "core/tensor.h"

namespace precis::optim {

// Returns the norm before clipping. max_norm <= 0 only measures. A non-finite
// norm is returned as is and nothing is scaled (the caller decides to skip).
double clip_grad_norm(const std::vector<Tensor>& params, double max_norm);

// The sync-free form for GPU gradients (train/trainer.cpp; CUDA graphs), which also does the
// loss scaler's unscale and inf/NaN check: the gradients may hold g * scale (`scale` a device
// f64 scalar, GradScaler::scale_on_device(); undefined for 1). The results stay on the device:
//   out[0]     = the norm above of the unscaled g, +inf when any element is inf or NaN
//   out[1]     = clip / scale, clip = max_norm / (norm + 1e-6) when max_norm > 0 and the norm
//                is finite and above max_norm, else 1
//   found_inf  = 1 when the norm is not finite, else 0 (a device f64 scalar, may be undefined:
//                GradScaler::found_inf())
// `out` is a dense f64 [2] on the gradients' GPU. Nothing is scaled here: the optimizer
// multiplies each gradient by out[1] as it reads it (AdamW::step_on_device), so the step
// makes no pass over the gradients of its own to unscale or clip them.
void clip_grad_norm_on_device(const std::vector<Tensor>& params, double max_norm, const Tensor& out,
                              const Tensor& scale = Tensor(), const Tensor& found_inf = Tensor());

}  // namespace precis::optim
