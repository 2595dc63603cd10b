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

}  // namespace precis::optim
