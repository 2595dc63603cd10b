// The CUDA kernels of the pooling ops (ops/pool.cpp): one thread per output cell forward,
// one per input cell backward (a gather), in the tensors' memory format.
#pragma once

#include "core/tensor.h"
#include "ops/conv.h"
#include "ops/pool_window.h"

namespace precis::ops::cuda {

// y (and, for max pooling, indices: u8 or i32, each output's first maximum's place in its
// window, PoolWindows::place_in_window) from x;
// average pooling when `indices` is undefined. x, y, indices dense in `format`.
void pool2d_forward(const Tensor& x, const Tensor& y, const Tensor& indices, const PoolWindows& p, MemoryFormat format);
// dx from gy (and the forward's indices for max pooling), all dense in `format`.
void pool2d_backward(const Tensor& gy, const Tensor& indices, const Tensor& dx, const PoolWindows& p,
                     MemoryFormat format);

}  // namespace precis::ops::cuda
