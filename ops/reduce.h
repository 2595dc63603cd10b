// Reductions. `dims` may be negative; an empty `dims` reduces over every dim.
// f16/bf16 inputs are reduced in f32 and the result rounded to the input dtype.
#pragma once

#include <utility>
#include <vector>

#include "core/tensor.h"

namespace precis::ops {

Tensor sum(const Tensor& x);
Tensor sum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim = false);
Tensor mean(const Tensor& x);
Tensor mean(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim = false);
// Max over one dim: (values, indices as i64). The gradient flows to the first maximum.
std::pair<Tensor, Tensor> max(const Tensor& x, int64_t dim, bool keepdim = false);
Tensor max(const Tensor& x);
// Max over several dims (values only); ties share the gradient equally, as in PyTorch.
Tensor amax(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim = false);
// Variance with Bessel's correction by default (correction = 1), as torch.var.
Tensor var(const Tensor& x, const std::vector<int64_t>& dims, int64_t correction = 1, bool keepdim = false);

// Sums `x` down to `shape` (the inverse of broadcasting `shape` up to x's shape).
Tensor sum_to_shape(const Tensor& x, const Shape& shape);

}  // namespace precis::ops
