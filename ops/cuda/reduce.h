// CUDA kernels of the reductions (ops/reduce_*.cpp), callable from plain C++.
// Validation, shapes and autograd stay in the op files. "Rows" are the dense
// [outer, inner] layout of ops/cpu/reduce_rows.h (the reduced dims moved last),
// on the GPU; results hold one value per row, in row order.
#pragma once

#include <utility>
#include <vector>

#include "core/tensor.h"

namespace precis::ops::cuda {

// Sums x over the dims flagged in `reduced` (one flag per dim of x) into a dense 1-d tensor of
// x's dtype with one value per kept position, in row-major order. Accumulates in f32 (f64 for
// f64, i64 for i64). Reads x in place when the reduced dims are innermost or one block of a
// contiguous x; otherwise from a permuted dense copy.
Tensor sum(const Tensor& x, const std::vector<bool>& reduced);

// The first maximum of each row: (values in the rows' dtype, indices as i64 when `with_indices`).
std::pair<Tensor, Tensor> max_rows(const Tensor& rows, bool with_indices);

// amax's backward: each element of x tied with its row's maximum gets grad / (number of ties),
// the others 0. `rows` are x's rows; `values` and `grad` hold one value per row (x's dtype, dense);
// `broadcast_strides` map x's index to its row (0 along the reduced dims).
Tensor amax_backward(const Tensor& x, const Tensor& rows, const Tensor& values, const Tensor& grad,
                     const Shape& broadcast_strides);

// max(x, dim)'s backward: a zero tensor of `shape` and `dtype` with grad[o] at x[a, indices[o], b],
// where o = (a, b) around dim `dim`. `grad` is dense in `dtype`.
Tensor max_backward(const Tensor& indices, const Tensor& grad, const Shape& shape, DType dtype, int64_t dim);

// Each row's sum of squared deviations from its mean, divided by `denom` (floating rows).
Tensor var_rows(const Tensor& rows, double denom);

// var's backward: grad * 2 (x - mean) / denom, the mean of x's row recomputed. Arguments as amax_backward's.
Tensor var_backward(const Tensor& x, const Tensor& rows, const Tensor& grad, const Shape& broadcast_strides,
                    double denom);

}  // namespace precis::ops::cuda
