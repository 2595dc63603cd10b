// Fused causal (or full) attention on the CPU over a packed qkv, the reference a learner reads
// beside the CUDA kernels (ops/cuda/flash_attention_*.cu): no T x T score matrix is ever
// stored, only one row of scores per thread. ops/flash_attention.cpp's flash_attention_packed
// calls it for f32 and f64 tensors on the CPU.
//
// qkv: contiguous [B, T, 3C], q, k, v side by side, each C = H D wide with head h at columns
// h D .. h D + D; out and dout: contiguous [B, T, C] (heads side by side, as the transformer
// reads them); lse: contiguous [B, H, T]; dqkv: contiguous [B, T, 3C]. All of one dtype.
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace precis::ops::cpu {

// out = softmax(scale q k^T, causal mask) v per head, and lse = each row's log-sum-exp.
void flash_attention_forward(const Tensor& qkv, int64_t n_head, bool causal, double scale, const Tensor& out,
                             const Tensor& lse);

// dqkv = the gradients of q, k and v from dout, recomputing each row of probabilities from lse.
void flash_attention_backward(const Tensor& qkv, const Tensor& out, const Tensor& lse, const Tensor& dout,
                              int64_t n_head, bool causal, double scale, const Tensor& dqkv);

}  // namespace precis::ops::cpu
