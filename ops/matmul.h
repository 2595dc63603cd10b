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
// A transformer's MLP: y = linear(gelu(linear(x, w1, b1)), w2, b2) (b1, b2 may be
// undefined). On the GPU the first product as linear_gelu's, and one autograd node whose
// backward applies the GELU's gradient in the epilogue of the product that makes it (the
// gradient of the GELU's output is never written); on the CPU the composition.
Tensor linear_gelu_linear(const Tensor& x, const Tensor& w1, const Tensor& b1, const Tensor& w2,
                          const Tensor& b2 = Tensor());

// TF32 tensor cores for f32 products on the GPU: inputs rounded to a 10-bit
// mantissa, f32 accumulation. Off unless set (the precision policy's allow_tf32
// sets it); nothing turns it on behind the user's back. CPU products ignore it.
void set_allow_tf32(bool allow);
bool allow_tf32();

// GPU products: time the algorithm heuristic's first few answers once per large
// problem and keep the fastest (ops/cuda/matmul_autotune.h), instead of taking its first
// answer. On by default; off gives the same algorithm, so the same rounding, in every
// process (a tuned choice can differ between runs when two algorithms time alike).
void set_matmul_autotune(bool autotune);
bool matmul_autotune();

}  // namespace precis::ops
