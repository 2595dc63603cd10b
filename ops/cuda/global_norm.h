// The global gradient norm and its clipping on the GPU (optim/clip_grad.cpp calls
// these for CUDA gradients). Tensors are batched as in ops/cuda/adamw.h: one launch
// covers up to kGlobalNormBatch tensors of one dtype, each block a chunk of one tensor.
#pragma once

#include <vector>

#include "core/tensor.h"

namespace precis::ops::cuda {

inline constexpr int kGlobalNormBatch = 32;

// sum over every tensor of sum_i t_i^2, in f64. Each block writes one partial sum, and
// one block adds the partials in a fixed order, so the result is the same on every run.
// The result is copied back once (one stream synchronisation). Dense floating tensors,
// all on one device.
double sum_of_squares(const std::vector<Tensor>& tensors);

// t <- t * factor for every tensor, in place (the product in f64, rounded to t's dtype).
void scale_(const std::vector<Tensor>& tensors, double factor);

}  // namespace precis::ops::cuda
