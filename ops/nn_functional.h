// The neural-network ops: softmax family, normalisation, embedding, losses, attention.
#pragma once

#include <optional>
#include <string>

#include "core/random.h"
#include "core/tensor.h"

namespace precis::ops {

Tensor softmax(const Tensor& x, int64_t dim);
Tensor log_softmax(const Tensor& x, int64_t dim);

// Layer norm over the last dim: (x - mean) * rstd * weight + bias, rstd = 1/sqrt(var + eps)
// (biased variance). weight/bias: [C] or undefined. Saves mean and rstd for backward.
// out_dtype: the result's dtype (default: x's, f32 under autocast); the math is the same,
// rounded once to it. A norm whose result only feeds a linear under autocast can be stored
// in the compute dtype, which is what the linear's cast would make of it, without that cast.
Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps = 1e-5,
                  std::optional<DType> out_dtype = std::nullopt);

// A transformer block's residual add and the layer norm after it: sum = x + residual (one
// shape; dtypes promote as in add) and normed = layer_norm(sum, weight, bias, eps), with
// layer_norm's autocast rule and out_dtype. One pass each way on the GPU (the gradients of sum and normed
// are added in the norm's backward); add then layer_norm on the CPU.
// residual_bias ([C] or undefined): the bias of the product that made `residual`, left out of
// it and added here to every row (sum = x + residual + residual_bias, in the sum's dtype; on
// the GPU summed in f32 and rounded once). Its gradient, the column sums of the sum's, is
// one more column sum of the norm's backward on the GPU: the product needs no bias-gradient
// pass of its own.
struct AddLayerNorm {
  Tensor sum, normed;
};
AddLayerNorm add_layer_norm(const Tensor& x, const Tensor& residual, const Tensor& weight, const Tensor& bias,
                            double eps = 1e-5, std::optional<DType> out_dtype = std::nullopt,
                            const Tensor& residual_bias = Tensor());

// out[..., :] = weight[indices[...], :]; indices i32 or i64. Backward scatter-adds into weight.
Tensor embedding(const Tensor& weight, const Tensor& indices);

// Fused log-softmax + negative log-likelihood, mean over the targets that are not
// ignore_index. logits: [N, C] (or [..., C]), targets: [N] (or [...]) i32/i64.
// classes (default: all C): only the first `classes` columns are scored, the rest is
// padding (a vocabulary padded to a multiple of 64) that is never read and gets a zero
// gradient, written with the others. Evenly spaced rows are read in place (no copy).
Tensor cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index = -100, int64_t classes = -1);

// The fused classifier (as llm.c's): cross_entropy's loss and, from the same pass over the
// logits, the gradient of grad_factor * loss with respect to them (their shape; zeros in
// the padding past `classes` and in ignored rows). Records nothing for autograd: the
// caller starts the backward from the logits, autograd::backward(logits, grad), instead
// of from the loss, so the logits are read once instead of twice. grad_factor: a scalar
// on the logits' device, the gradient the loss would receive (loss scale / micro-batches),
// read there, so that a replayed CUDA graph sees its current value. overwrite_logits: the
// gradient is written over the logits, which must be dense and are gone afterwards (the
// memory of a second [N, C] tensor saved).
struct LossAndGradient {
  Tensor loss;  // scalar, f32 (f64 for f64 logits), no grad_fn
  Tensor grad;  // d (grad_factor * loss) / d logits, the logits' shape and dtype
};
LossAndGradient cross_entropy_with_grad(const Tensor& logits, const Tensor& targets, const Tensor& grad_factor,
                                        int64_t ignore_index = -100, int64_t classes = -1,
                                        bool overwrite_logits = false);

// Which implementation scaled_dot_product_attention uses: the fused flash-attention
// kernel wherever it can run these inputs (else the reference), or always the reference.
enum class AttentionImpl { flash, reference };

// softmax(q k^T * scale + mask) v over the last two dims, q: [..., Tq, D], k, v: [..., Tk, D].
// causal hides key j > query i (top-left aligned). scale defaults to 1/sqrt(D).
// AttentionImpl::flash runs flash_attention when flash_attention_unsupported says
// nothing against it; otherwise (and with AttentionImpl::reference) the plain
// reference implementation built from the ops above runs.
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal = false,
                                    double dropout_p = 0.0, std::optional<double> scale = std::nullopt,
                                    Generator* gen = nullptr, AttentionImpl impl = AttentionImpl::flash);

// The fused attention (ops/flash_attention.cpp): the same function as the reference
// without its Tq x Tk matrices. q [B, H, Tq, D], k, v [B, H, Tk, D], f16/bf16 on CUDA,
// D 64 or 128, no dropout. The output is a [B, H, Tq, D] view of [B, Tq, H, D] memory.
Tensor flash_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal = false,
                       std::optional<double> scale = std::nullopt);
// Attention straight from the fused c_attn product: qkv [B, T, 3C] holds q, k, v side by
// side (C = n_head * D); returns y [B, T, C] (heads side by side, ready for c_proj). Its
// backward writes d(qkv) in one buffer, where the split/transpose views of the unpacked
// path cost a zero fill and three strided copies per layer.
// qkv_bias (optional, [3C]): the bias that the product making qkv added (qkv = x W^T +
// qkv_bias) with its gradient left to this op: the product took qkv_bias detached, and this
// op's backward gives qkv_bias its gradient, the column sums of d(qkv), summed in f32 and
// rounded once as linear's bias gradient (into its .grad where the engine offers it, f32 or
// qkv's dtype, added with gradient accumulation). On a GPU the attention kernels sum d(qkv)
// as they write it (ops/cuda/flash_attention.h, FlashGradSums), so d(qkv) is not read again;
// on the CPU linear's column sums run on d(qkv) (ops/cpu/linear.h).
Tensor flash_attention_packed(const Tensor& qkv, int64_t n_head, bool causal = true, const Tensor& qkv_bias = Tensor());
std::optional<std::string> flash_attention_packed_unsupported(const Tensor& qkv, int64_t n_head);
// The same for a qkv not made yet: dtype, device, shape [B, T, 3C], unit last-dim stride
// (a product's output), so that the product can be told to leave its bias to the attention.
std::optional<std::string> flash_attention_packed_unsupported(DType dtype, Device device, const Shape& qkv_shape,
                                                              int64_t n_head);
// Why flash_attention cannot run these inputs (a phrase for a note), or nothing when it can.
std::optional<std::string> flash_attention_unsupported(const Tensor& q, const Tensor& k, const Tensor& v,
                                                       double dropout_p = 0.0);

}  // namespace precis::ops
