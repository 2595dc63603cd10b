// The global gradient norm and its clipping on the GPU (optim/clip_grad.cpp calls
// these for CUDA gradients). Tensors are batched as in ops/cuda/adamw.h: one launch
// covers up to kGlobalNormBatch tensors of one dtype, each block a chunk of one tensor.
#pragma once

#include <vector>

#include "core/tensor.h"

namespace precis::ops::cuda {

inline constexpr int kGlobalNormBatch = 256;

// sum over every tensor of sum_i t_i^2, in f64. Each block writes one partial sum, and
// one block adds the partials in a fixed order, so the result is the same on every run.
// The result is copied back once (one stream synchronisation). Dense floating tensors,
// all on one device.
double sum_of_squares(const std::vector<Tensor>& tensors);

// The same sum, then on the device, with nothing copied back (capturable into a CUDA graph),
// for tensors that hold g * scale (`scale` a device f64 scalar, or undefined for 1: the loss
// scaler's gradients):
//   finite     = the sum is finite (no element inf or NaN: squares of f32/f16/bf16 values in
//                f64 cannot overflow, so only a non-finite element makes it so)
//   out[0]     = norm = sqrt(sum) / scale if finite, else +inf
//   out[1]     = clip / scale, clip = max_norm / (norm + 1e-6) if max_norm > 0, finite and
//                norm > max_norm, else 1: the factor that takes each element to its clipped,
//                unscaled value
//   *found_inf = finite ? 0 : 1, when `found_inf` (a device f64 scalar) is given.
// `out` a dense f64 [2] on the tensors' device.
void global_norm_and_clip_factor(const std::vector<Tensor>& tensors, double max_norm, const Tensor& scale,
                                 const Tensor& found_inf, const Tensor& out);

// t <- t * factor for every tensor, in place (the product in f64, rounded to t's dtype).
void scale_(const std::vector<Tensor>& tensors, double factor);

}  // namespace precis::ops::cuda
