// Matrix products: Eigen's blocked GEMM (multithreaded with OpenMP) on the CPU,
// cuBLASLt on the GPU (ops/cuda/matmul.h).
#pragma once

#include "core/tensor.h"

namespace precis::ops {

// a: [..., M, K], b: [..., K, N] -> [..., M, N]; batch dims broadcast.
// 1-D operands are treated as in numpy (a vector is a row of a or a column of b).
// Transposed views (x.transpose(-2, -1)) are read in place, without a copy.
Tensor matmul(const Tensor& a, const Tensor& b);
// y = x W^T + b, with x: [..., in], W: [out, in], b: [out] or undefined.
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor());
// y = gelu(x W^T + b), the tanh GELU of gelu(). On the GPU one cuBLASLt call whose
// epilogue adds b, applies the GELU and keeps its input for the backward; on the
// CPU gelu(linear(x, weight, bias)).
Tensor linear_gelu(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor());

// TF32 tensor cores for f32 products on the GPU: inputs rounded to a 10-bit
// mantissa, f32 accumulation. Off unless set (the precision policy's allow_tf32
// sets it); nothing turns it on behind the user's back. CPU products ignore it.
void set_allow_tf32(bool allow);
bool allow_tf32();

}  // namespace precis::ops
