// The GPU side of batch_norm (ops/batch_norm.cpp): cuDNN's spatial batch norm on 4-D tensors
// dense in `format`, with the [C] parameters and statistics in f32; and the relu passes of
// batch_norm_relu.
#pragma once

#include "core/tensor.h"
#include "ops/conv.h"

namespace precis::ops::cuda {

struct BatchNormForward {
  Tensor x, y, weight, bias;         // weight, bias: f32 [C]
  Tensor running_mean, running_var;  // f32 [C], updated in place when training; may be undefined then
  Tensor save_mean, save_invstd;     // f32 [C], written
  double momentum, eps;
  MemoryFormat format;
  bool training, relu;
};
void batch_norm_forward(const BatchNormForward& f);

// The training-mode gradients: dx, and dw, db (f32 [C]) from gy and the forward's statistics.
struct BatchNormBackward {
  Tensor x, gy, weight, save_mean, save_invstd, dx, dw, db;
  double eps;
  MemoryFormat format;
};
void batch_norm_backward(const BatchNormBackward& b);

// gy where y > 0, else 0 (the relu's gradient); gy and y dense in one memory format.
Tensor relu_mask(const Tensor& gy, const Tensor& y);

}  // namespace precis::ops::cuda
