// The global gradient norm and its clip factor on the GPU (optim/clip_grad.cpp calls
// it for CUDA gradients; plain C++ declarations). Tensors are batched as in
// optim/cuda/adamw.h: one launch covers up to kGradNormBatch tensors of one dtype,
// each block a chunk of one tensor.
#pragma once

#include <functional>
#include <vector>

#include "core/tensor.h"

namespace precis::optim::cuda {

inline constexpr int kGradNormBatch = 256;

// sum over every tensor of sum_i t_i^2 in f64 (each block writes one partial sum, and one
// block adds the partials in a fixed order, so the result is the same on every run), then
// optim/grad_norm_rule.h's rule in a one-thread kernel: out = {norm, factor}, and
// *found_inf when given. `scale`, `found_inf`: f64 scalars or undefined; `out` a dense
// f64 [2]; all on the tensors' device. `reduce_sum`, when given, is called with the total
// (an f64 [1] on the device) between the sum and the rule (optim/clip_grad.h). Nothing is
// copied back: capturable into a CUDA graph.
void grad_norm_and_factor(const std::vector<Tensor>& tensors, double max_norm, const Tensor& scale,
                          const Tensor& found_inf, const Tensor& out,
                          const std::function<void(const Tensor&)>& reduce_sum = {});

}  // namespace precis::optim::cuda
