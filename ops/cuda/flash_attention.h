// Launchers of the flash-attention kernels (ops/cuda/flash_attention_*.cu), on
// Tensors already checked by ops/flash_attention.cpp:
//   q [B, H, Tq, D], k and v [B, H, Tk, D], f16 or bf16, any strides with a unit
//   last-dim stride, 16-byte aligned rows; D one of kFlashHeadDims.
// They run on the compute stream of q's device and do not synchronise.
#pragma once

#include "core/tensor.h"

namespace precis::ops::cuda {

inline constexpr int kFlashHeadDims[] = {64, 128};

// out (q's shape, any strides with unit last-dim stride, 16-byte aligned rows) =
// softmax(q k^T * scale, causal) v;
// lse [B, H, Tq] f32 dense = the natural log of each row's softmax denominator
// (log sum_j exp(scale q.k_j)), the one statistic backward needs.
void flash_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double scale,
                             const Tensor& out, const Tensor& lse);

// dq, dk, dv (the shapes of q, k, v; any strides with unit last-dim stride) from the
// forward's out and lse and the output gradient dout (out's shape, 16-byte aligned rows).
void flash_attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                              const Tensor& dout, bool causal, double scale, const Tensor& dq, const Tensor& dk,
                              const Tensor& dv);

}  // namespace precis::ops::cuda
