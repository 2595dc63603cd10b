// Matrix products on the GPU through cuBLASLt (docs/architecture.md, "The CUDA runtime"). Plain C++
// declarations: ops/matmul.cpp calls them behind PRECIS_WITH_CUDA, and every
// CUDA type stays in the .cu files (matmul.cu, cublaslt.cu, matmul_autotune.cu).
//
// Each function writes into outputs its caller allocated (a test can poison
// them first), runs on cuda::compute_stream of the operands' device, and takes
// operands of one dtype: f32 (on TF32 tensor cores when ops::allow_tf32()), f16
// or bf16 (both accumulated in f32). Row-major operands and transposed views
// are read in place; other strides are copied with .contiguous() first.
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace precis::ops::cuda {

// out = a @ b with a: [..., M, K], b: [..., K, N]; their batch dims broadcast to
// out's; out: contiguous [batch..., M, N]. One strided-batched cuBLASLt call per
// block of batch dims whose strides line up (a broadcast operand gets batch
// stride 0); a batch that shares one b is folded into a single [batch*M, K] product.
void matmul(const Tensor& out, const Tensor& a, const Tensor& b);

// out = x W^T + bias, then GELU (tanh approximation) when `gelu`, in one cuBLASLt
// call whose epilogue adds the bias and applies the GELU. x: [N, in],
// weight: [out, in], bias: [out] or undefined, out: contiguous [N, out].
// With `gelu`, a defined `pre_gelu` receives x W^T + bias (the GELU input, for the
// backward): a [N, out] view with unit column stride and a row stride of
// gelu_aux_ld(out), the multiple of 8 cuBLASLt asks of its aux matrix.
void linear(const Tensor& out, const Tensor& x, const Tensor& weight, const Tensor& bias, bool gelu = false,
            const Tensor& pre_gelu = Tensor());
int64_t gelu_aux_ld(int64_t out_features);

// Parameter gradients of linear, with g = grad_out: [N, out] and x: [N, in]:
// grad_weight = g^T x ([out, in]) and, when grad_bias is defined, grad_bias =
// g summed over its rows ([out]), fused into the grad_weight product (BGRADB), or
// by column_sums (column_sums.h) after the plain product where autotuning found
// that faster, or the epilogue is off or has no algorithm. Each output is contiguous,
// in the operands' dtype or in f32 (f16/bf16 operands then give their f32 sums
// unrounded: a parameter's f32 .grad, written where it lies); with accumulate_* the
// gradient is added to what the output holds instead of written over it.
void linear_param_backward(const Tensor& grad_weight, const Tensor& grad_bias, const Tensor& grad_out, const Tensor& x,
                           bool accumulate_weight = false, bool accumulate_bias = false);

// grad_pre = grad_out * gelu'(pre): grad_out and grad_pre contiguous [N, out],
// pre as linear's pre_gelu (unit column stride, any row stride).
void gelu_backward(const Tensor& grad_pre, const Tensor& grad_out, const Tensor& pre);

// The input gradient of a linear whose input was gelu(pre), through the GELU:
// grad_pre = (grad_out W) * gelu'(pre), one cuBLASLt call whose DGELU epilogue applies
// gelu' as the product is written (a plain product and gelu_backward where cuBLASLt has
// no algorithm for it). grad_out: [N, out], weight: [out, in], pre as linear's pre_gelu
// [N, in], grad_pre contiguous [N, in]. grad_pre_sums (contiguous [in], optional): grad_pre
// summed over its rows, the bias gradient of the linear that made pre, by the same
// epilogue (DGELU_BGRAD) or column_sums after it, whichever autotuning timed faster; in
// the operands' dtype or f32, added to what it holds with accumulate_sums (by column_sums
// where it is in the operands' dtype: the f32 sums added, rounded once).
void linear_gelu_input_backward(const Tensor& grad_pre, const Tensor& grad_out, const Tensor& weight, const Tensor& pre,
                                const Tensor& grad_pre_sums = Tensor(), bool accumulate_sums = false);

// When off, linear applies bias and GELU, and linear_param_backward sums the
// bias gradient, with separate kernels after a plain product: the path taken
// (with a one-time note) where cuBLASLt has no algorithm for an epilogue. For
// tests and benchmarks; on by default.
void set_fuse_epilogues(bool fuse);
bool fuse_epilogues();

// The algorithm heuristic is asked once per problem (device, shapes, strides,
// dtypes, transposes, pointer alignments, epilogue) and its answer cached; with
// ops::matmul_autotune() on, large problems time the heuristic's first answers once
// and cache the fastest (ops/cuda/matmul_autotune.h says how).
struct MatmulCacheStats {
  int64_t lookups = 0;    // products planned
  int64_t hits = 0;       // of which found their algorithm in the cache
  int64_t entries = 0;    // problems cached
  int64_t autotuned = 0;  // problems whose algorithm was chosen by timing candidates
};
MatmulCacheStats matmul_cache_stats();

}  // namespace precis::ops::cuda
