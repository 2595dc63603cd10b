// The CUDA kernels of batch_norm and batch_norm_relu (ops/batch_norm.cpp), on x seen as
// [N, C, S] (S the product of the dims after C) dense in `format` (channels-last: 4-D only),
// f32, f16 or bf16, with the [C] parameters and statistics in f32.
#pragma once

#include "core/tensor.h"
#include "ops/conv.h"

namespace precis::ops::cuda {

struct BatchNormForward {
  Tensor x, y, weight, bias;         // weight, bias: f32 [C]
  Tensor running_mean, running_var;  // f32 [C]: read in eval, updated in place in training (may be undefined then)
  Tensor save_mean, save_invstd;     // f32 [C], written: the statistics used
  double momentum, eps;
  MemoryFormat format;
  bool training, relu;
};
void batch_norm_forward(const BatchNormForward& f);

// dx, and dw, db (f32 [C]), from gy, the forward's x and statistics (and y for the relu's mask).
struct BatchNormBackward {
  Tensor x, y, gy, weight, save_mean, save_invstd;  // y: batch_norm_relu only (else undefined); gy laid out as x
  Tensor dx, dw, db;
  MemoryFormat format;
  bool training;
};
void batch_norm_backward(const BatchNormBackward& b);

}  // namespace precis::ops::cuda
