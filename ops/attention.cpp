// scaled_dot_product_attention: dispatches to the fused flash attention
// (ops/flash_attention.cpp) where it can run, else runs the plain reference implementation,
//   out = dropout(softmax(q k^T * scale, masked)) v,
// composed from matmul, mul, masked_fill, softmax and dropout, so its gradient
// is the chain of theirs. It materialises the [..., Tq, Tk] score matrix; the
// fused kernel is the fast path and is checked against this one.
//
// The causal mask is aligned top-left, as PyTorch's is_causal: query i sees keys
// j <= i, whatever Tq and Tk are. Key 0 is always visible, so no row is all -inf.
#include <algorithm>
#include <cmath>
#include <limits>

#include "ops/autocast.h"
#include "ops/checks.h"
#include "ops/elementwise.h"
#include "ops/matmul.h"
#include "ops/nn_functional.h"
#include "ops/op_cost.h"

namespace precis::ops {

namespace {

constexpr const char* kOp = "scaled_dot_product_attention";

bool broadcastable(const Shape& a, const Shape& b) {
  for (size_t i = 1; i <= std::min(a.size(), b.size()); ++i) {
    int64_t x = a[a.size() - i], y = b[b.size() - i];
    if (x != y && x != 1 && y != 1) return false;
  }
  return true;
}

Shape batch_dims(const Tensor& t) { return Shape(t.shape().begin(), t.shape().end() - 2); }

void check_arguments(const Tensor& q, const Tensor& k, const Tensor& v, double dropout_p) {
  require_defined(kOp, q, "query");
  require_defined(kOp, k, "key");
  require_defined(kOp, v, "value");
  common_device(kOp, {&q, &k, &v});
  require_floating(kOp, q, "query");
  PRECIS_CHECK(k.dtype() == q.dtype() && v.dtype() == q.dtype(), kOp,
               ": query, key and value must have one dtype, got query ", describe(q), ", key ", describe(k), ", value ",
               describe(v));
  PRECIS_CHECK(q.dim() >= 2 && k.dim() >= 2 && v.dim() >= 2, kOp,
               ": query, key and value must be [..., T, D], got query ", q.shape(), ", key ", k.shape(), ", value ",
               v.shape());
  PRECIS_CHECK(k.size(-1) == q.size(-1), kOp, ": query ", q.shape(), " and key ", k.shape(),
               " must have the same head size (last dim)");
  PRECIS_CHECK(v.size(-2) == k.size(-2), kOp, ": key ", k.shape(), " and value ", v.shape(),
               " must have the same number of positions (dim -2)");
  PRECIS_CHECK(broadcastable(batch_dims(q), batch_dims(k)) && broadcastable(batch_dims(q), batch_dims(v)) &&
                   broadcastable(batch_dims(k), batch_dims(v)),
               kOp, ": the batch dims of query ", q.shape(), ", key ", k.shape(), " and value ", v.shape(),
               " do not broadcast together");
  PRECIS_CHECK(dropout_p >= 0.0 && dropout_p <= 1.0, kOp, ": dropout_p must be in [0, 1], got ", dropout_p);
}

// [Tq, Tk] bool, true where key j > query i: the top-left corner of a square causal mask.
Tensor top_left_causal_mask(int64_t Tq, int64_t Tk, Device device) {
  return causal_mask(std::max(Tq, Tk), device).narrow(0, 0, Tq).narrow(1, 0, Tk);
}

}  // namespace

Tensor scaled_dot_product_attention(const Tensor& q_arg, const Tensor& k_arg, const Tensor& v_arg, bool causal,
                                    double dropout_p, std::optional<double> scale, Generator* gen, AttentionImpl impl) {
  // autocast: attention's products run in the compute dtype (its softmax in f32).
  const Tensor q = autocast::to_compute(q_arg), k = autocast::to_compute(k_arg), v = autocast::to_compute(v_arg);
  check_arguments(q, k, v, dropout_p);
  if (impl == AttentionImpl::flash && !flash_attention_unsupported(q, k, v, dropout_p))
    return flash_attention(q, k, v, causal, scale);
  const int64_t Tq = q.size(-2), Tk = k.size(-2), D = q.size(-1);
  // The reference path computes every score, masked or not: costed as not causal.
  OpScope timed("attention", [&] {
    return cost::attention(1, q.numel() / std::max<int64_t>(Tq * D, 1), Tq, Tk, D, false, true, q.dtype());
  });
  const double s = scale.value_or(1.0 / std::sqrt(static_cast<double>(D)));
  Tensor scores = mul(matmul(q, k.transpose(-2, -1)), s);
  if (causal)
    scores = masked_fill(scores, top_left_causal_mask(Tq, Tk, q.device()), -std::numeric_limits<double>::infinity());
  Tensor weights = softmax(scores, -1);
  if (dropout_p > 0.0) weights = dropout(weights, dropout_p, true, gen);
  return matmul(weights, v);
}

}  // namespace precis::ops
