// clip_grad_norm: the global L2 norm of all gradients, and the factor that clips it
// to max_norm (as torch.nn.utils.clip_grad_norm_, but the factor is returned instead
// of applied: the optimizer multiplies each gradient by it as it reads it, so the
// step makes no pass over the gradients of its own):
//   total = sqrt(sum_i ||g_i||^2);  factor = max_norm / (total + 1e-6) if total > max_norm, else 1
//
// It also does the loss scaler's unscale and inf/NaN check: the gradients may hold
// g * scale (`scale`, GradScaler::scale_tensor(); undefined for 1), and found_inf
// (GradScaler::found_inf(), or undefined) is set when any gradient is inf or NaN
// (optim/grad_norm_rule.h has the rule). A CPU loop or CUDA kernels by the gradients'
// device, nothing read back on a GPU (capturable into a CUDA graph).
//
// When each rank holds a shard of the gradients (ZeRO-1, distributed/zero.h), the norm
// is over all of them: `reduce_sum` is called with the f64 sum of squares of this
// call's gradients (a [1] tensor on their device, in stream order) and sums it over the
// ranks in place, before the rule turns it into the norm, the factor and found_inf.
#pragma once

#include <functional>
#include <vector>

#include "core/tensor.h"

namespace precis::optim {

// Returns {norm, factor} (f64 [2] on the gradients' device; into `out` when given, a
// fixed buffer for a CUDA graph): the norm of the unscaled gradients, +inf when any
// element is inf or NaN (then the factor is 1 / scale: nothing is clipped), and the
// factor for StepInputs::grad_factor (out.select(0, 1)). max_norm <= 0 only measures.
using SumReduction = std::function<void(const Tensor& sum)>;
Tensor clip_grad_norm(const std::vector<Tensor>& params, double max_norm, const Tensor& scale = Tensor(),
                      const Tensor& found_inf = Tensor(), Tensor out = Tensor(), const SumReduction& reduce_sum = {});

}  // namespace precis::optim
