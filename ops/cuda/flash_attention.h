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

// The column sums of the gradients the backward writes, for the bias of the product that
// made q, k and v (GPT-2's qkv linear, whose bias gradient is the column sums of d(qkv)):
// sums, contiguous [3 H D] in f32 or q's dtype, gets
//   sums[p H D + h D + d] = sum over b and t of g_p[b, h, t, d],   g_0 = dq, g_1 = dk, g_2 = dv,
// of the values as written (rounded to q's dtype), added in f32 and rounded once; with
// `accumulate` added to what sums holds (in f32, rounded once). The kernels that write the
// gradients add up their own rows as they write them (one f32 partial row per key block,
// and per chunk of dq rows) and a small kernel adds the partial rows: dq, dk, dv are not
// read again. Every order is fixed by the shape (no atomics): the same bits on every run.
struct FlashGradSums {
  Tensor sums;  // undefined: no sums
  bool accumulate = false;
};

// dq, dk, dv (the shapes of q, k, v; any strides with unit last-dim stride) from the
// forward's out and lse and the output gradient dout (out's shape, 16-byte aligned rows);
// and grad_sums where given.
void flash_attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                              const Tensor& dout, bool causal, double scale, const Tensor& dq, const Tensor& dk,
                              const Tensor& dv, const FlashGradSums& grad_sums = {});

}  // namespace precis::ops::cuda
