// tap: an identity op that lets a caller look at a tensor as it passes forward
// and at its gradient as it passes backward. The numerics report uses it to
// watch activations and their gradients without changing the computation.
#pragma once

#include <functional>

#include "core/tensor.h"

namespace precis::ops {

using TapFn = std::function<void(const Tensor&)>;

// Returns x (as a new handle on the same data); calls on_forward(x) now and
// on_backward(grad) when the gradient of the result is computed.
Tensor tap(const Tensor& x, const TapFn& on_forward, const TapFn& on_backward);

}  // namespace precis::ops
