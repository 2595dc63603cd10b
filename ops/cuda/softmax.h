// The CUDA softmax (ops/cuda/softmax.cu), a plain C++ launcher on Tensors: ops/softmax.cpp
// validates, allocates the outputs on the device and calls it; it runs on the compute stream
// of its tensors' device and does not synchronise.
#pragma once

#include "core/tensor.h"

namespace precis::ops::cuda {

// y = softmax(x) (or log_softmax) along the last dim; x, y dense, one shape and dtype.
void softmax_forward(const Tensor& x, const Tensor& y, bool log);
// dx from the output y and its gradient g; all dense, one shape and dtype.
void softmax_backward(const Tensor& y, const Tensor& g, const Tensor& dx, bool log);

}  // namespace precis::ops::cuda
