// The CUDA kernels of add_relu (ops/residual.cpp), over dense buffers of one memory format
// (an element's position is the same in each).
#pragma once

#include "core/tensor.h"

namespace precis::ops::cuda {

// y = max(0, x + residual)
void add_relu_forward(const Tensor& x, const Tensor& residual, const Tensor& y);
// dx = y > 0 ? g : 0
void relu_mask(const Tensor& g, const Tensor& y, const Tensor& dx);

}  // namespace precis::ops::cuda
