// The CPU kernels of the fused linear ops (ops/matmul.cpp's linear, linear_gelu and
// linear_gelu_linear), one for each of their CUDA counterparts in ops/cuda/matmul.h and with the
// same arguments, so one autograd node serves both devices. Each product is one Eigen GEMM
// (blocked, vectorised, spread over the OpenMP threads) on the operands in place; the bias, the
// GELU and their gradients are one pass over the rows after it, where cuBLASLt has an epilogue.
//
// f32 and f64; all tensors on the CPU, of one dtype, 2-D with unit column stride (any row
// stride), outputs allocated by the caller. With accumulate_*, a gradient is added to what its
// output holds instead of written over it.
#pragma once

#include "core/tensor.h"

namespace precis::ops::cpu {

// out = a @ b; a: [M, K], b: [K, N] (or a transposed view), out: [M, N].
void matmul(const Tensor& out, const Tensor& a, const Tensor& b);

// out = x W^T + bias, then GELU when `gelu` (ops/cpu/gelu.h); x: [N, in], weight: [out, in],
// bias: [out] or undefined. With `gelu`, a defined pre_gelu [N, out] receives x W^T + bias.
void linear(const Tensor& out, const Tensor& x, const Tensor& weight, const Tensor& bias, bool gelu,
            const Tensor& pre_gelu);

// grad_weight = g^T x ([out, in]) and, when defined, grad_bias = g summed over its rows ([out]),
// with g = grad_out: [N, out], x: [N, in]. Either output may be undefined (not wanted).
void linear_param_backward(const Tensor& grad_weight, const Tensor& grad_bias, const Tensor& grad_out, const Tensor& x,
                           bool accumulate_weight, bool accumulate_bias);

// grad_pre = grad_out * gelu'(pre), all [N, out].
void gelu_backward(const Tensor& grad_pre, const Tensor& grad_out, const Tensor& pre);

// grad_pre = (grad_out W) * gelu'(pre): grad_out [N, out], weight [out, in], pre and grad_pre
// [N, in]; when defined, grad_pre_sums [in] = grad_pre summed over its rows.
void linear_gelu_input_backward(const Tensor& grad_pre, const Tensor& grad_out, const Tensor& weight, const Tensor& pre,
                                const Tensor& grad_pre_sums, bool accumulate_sums);

}  // namespace precis::ops::cpu
