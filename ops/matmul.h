// Matrix products through Eigen's blocked GEMM (multithreaded with OpenMP).
#pragma once

#include "core/tensor.h"

namespace precis::ops {

// a: [..., M, K], b: [..., K, N] -> [..., M, N]; batch dims broadcast.
// 1-D operands are treated as in numpy (a vector is a row of a or a column of b).
// Transposed views (x.transpose(-2, -1)) are read in place, without a copy.
Tensor matmul(const Tensor& a, const Tensor& b);
// y = x W^T + b, with x: [..., in], W: [out, in], b: [out] or undefined.
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor());

}  // namespace precis::ops
