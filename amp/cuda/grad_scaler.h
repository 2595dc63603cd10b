// The GPU half of GradScaler::unscale_and_check (plain C++ declaration).
#pragma once

#include "core/tensor.h"

namespace precis::amp::cuda {

// g[i] *= inv_scale over a dense floating gradient on the GPU; returns whether any
// element was inf or NaN before scaling (one 4-byte copy back, one sync).
bool unscale_and_check(const Tensor& grad, double inv_scale);

}  // namespace precis::amp::cuda
