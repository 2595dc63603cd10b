// The neural-network ops: softmax family, normalisation, embedding, losses, attention.
#pragma once

#include <optional>

#include "core/random.h"
#include "core/tensor.h"

namespace precis::ops {

Tensor softmax(const Tensor& x, int64_t dim);
Tensor log_softmax(const Tensor& x, int64_t dim);

// Layer norm over the last dim: (x - mean) * rstd * weight + bias, rstd = 1/sqrt(var + eps)
// (biased variance). weight/bias: [C] or undefined. Saves mean and rstd for backward.
Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps = 1e-5);

// out[..., :] = weight[indices[...], :]; indices i32 or i64. Backward scatter-adds into weight.
Tensor embedding(const Tensor& weight, const Tensor& indices);

// Fused log-softmax + negative log-likelihood, mean over the targets that are not
// ignore_index. logits: [N, C] (or [..., C]), targets: [N] (or [...]) i32/i64.
Tensor cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index = -100);

// softmax(q k^T * scale + mask) v over the last two dims, q: [..., Tq, D], k, v: [..., Tk, D].
// causal hides key j > query i. scale defaults to 1/sqrt(D). The plain reference
// implementation, built from the ops above.
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal = false,
                                    double dropout_p = 0.0, std::optional<double> scale = std::nullopt,
                                    Generator* gen = nullptr);

}  // namespace precis::ops
