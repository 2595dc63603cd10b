#include "nn/transformer.h"

#include <atomic>
#include <iostream>
#include <string>

#include "nn/parameter_gate.h"
#include "ops/autocast.h"
#include "ops/elementwise.h"
#include "ops/matmul.h"
#include "ops/nn_functional.h"
#include "ops/shape_ops.h"

namespace precis::nn {

CausalSelfAttention::CausalSelfAttention(const TransformerConfig& config, Generator* dropout_gen)
    : Module("CausalSelfAttention"), config_(config), dropout_gen_(dropout_gen) {
  PRECIS_CHECK(config.n_head > 0 && config.n_embd % config.n_head == 0, "CausalSelfAttention: n_embd (", config.n_embd,
               ") must be a multiple of n_head (", config.n_head, ")");
  c_attn = register_module(
      "c_attn", std::make_shared<Linear>(config.n_embd, 3 * config.n_embd, LinearOptions{.bias = config.bias}));
  c_proj = register_module("c_proj",
                           std::make_shared<Linear>(config.n_embd, config.n_embd, LinearOptions{.bias = config.bias}));
  resid_dropout_ = register_module("resid_dropout", std::make_shared<Dropout>(config.dropout, dropout_gen));
}

// model.attention: flash asks for the fused kernel; where it cannot run on a GPU (an f32
// policy, attention dropout) the reference runs instead, and one line per process says why.
ops::AttentionImpl CausalSelfAttention::attention_impl(const Tensor& q, double dropout_p) const {
  if (config_.attention != "flash") return ops::AttentionImpl::reference;
  static std::atomic<bool> noted{false};
  if (q.is_cuda() && !noted.load()) {
    const Tensor qc = ops::autocast::to_compute(q);  // the dtype attention will compute in
    if (auto why = ops::flash_attention_unsupported(qc, qc, qc, dropout_p); why && !noted.exchange(true))
      std::cerr << "note: model.attention is flash, but the reference attention runs: " << *why << "\n";
  }
  return ops::AttentionImpl::flash;
}

// Whether the packed flash attention will run on c_attn(x), before the product: c_attn's
// output is a fresh [B, T, 3C] in the linear's dtype (the compute dtype under autocast, else
// its operands' promoted dtype), which attend() casts to the compute dtype.
bool CausalSelfAttention::packed_flash_runs(const Tensor& x, double dropout_p) const {
  if (config_.attention != "flash" || dropout_p != 0.0) return false;
  DType dtype = promote_types(x.dtype(), c_attn->weight.dtype());
  if (c_attn->bias.defined()) dtype = promote_types(dtype, c_attn->bias.dtype());
  if (ops::autocast::enabled()) dtype = ops::autocast::compute_dtype();
  return !ops::flash_attention_packed_unsupported(dtype, x.device(), {x.size(0), x.size(1), 3 * config_.n_embd},
                                                  config_.n_head);
}

Tensor CausalSelfAttention::attend(const Tensor& x) {
  PRECIS_CHECK(x.dim() == 3 && x.size(2) == config_.n_embd, "CausalSelfAttention: expected input [B, T, ",
               config_.n_embd, "], got ", x.shape());
  const int64_t B = x.size(0), T = x.size(1), C = config_.n_embd, H = config_.n_head, D = C / H;
  double attn_dropout = is_training() ? config_.dropout : 0.0;
  // Where the packed flash attention runs, it also makes c_attn's bias gradient: its kernels
  // sum d(qkv) as they write it (ops/nn_functional.h, flash_attention_packed's qkv_bias), and
  // the product adds the bias without taking its gradient.
  const Tensor qkv_bias =
      c_attn->bias.defined() && packed_flash_runs(x, attn_dropout) ? ops::autocast::to_compute(c_attn->bias) : Tensor();
  const Tensor qkv = qkv_bias.defined() ? ops::linear(x, c_attn->weight, qkv_bias.detach()) : c_attn->forward(x);
  Tensor y;
  if (qkv_bias.defined() || (config_.attention == "flash" && attn_dropout == 0.0 &&
                             !ops::flash_attention_packed_unsupported(ops::autocast::to_compute(qkv), H))) {
    y = ops::flash_attention_packed(ops::autocast::to_compute(qkv), H, /*causal=*/true, qkv_bias);  // the fast path
  } else {
    std::vector<Tensor> parts = ops::split(qkv, C, 2);
    // [B, T, C] -> [B, H, T, D]
    auto heads = [&](const Tensor& t) { return t.view({B, T, H, D}).transpose(1, 2); };
    const Tensor q = heads(parts[0]), k = heads(parts[1]), v = heads(parts[2]);
    const ops::AttentionImpl impl = attention_impl(q, attn_dropout);
    y = ops::scaled_dot_product_attention(q, k, v, /*causal=*/true, attn_dropout, std::nullopt, dropout_gen_, impl);
    y = y.transpose(1, 2).reshape({B, T, C});
  }
  return y;
}

Tensor CausalSelfAttention::forward(const Tensor& x) { return resid_dropout_->forward(c_proj->forward(attend(x))); }

// Whether `dropout` passes its input through unchanged (eval mode, or p = 0).
static bool passes_through(const Dropout& dropout) { return !dropout.is_training() || dropout.p == 0.0; }

Branch CausalSelfAttention::forward_branch(const Tensor& x) {
  if (!passes_through(*resid_dropout_)) return {forward(x), Tensor()};
  return {ops::linear(attend(x), c_proj->weight), c_proj->bias};
}

MLP::MLP(const TransformerConfig& config, Generator* dropout_gen) : Module("MLP") {
  c_fc = register_module(
      "c_fc", std::make_shared<Linear>(config.n_embd, 4 * config.n_embd, LinearOptions{.bias = config.bias}));
  c_proj = register_module(
      "c_proj", std::make_shared<Linear>(4 * config.n_embd, config.n_embd, LinearOptions{.bias = config.bias}));
  dropout_ = register_module("dropout", std::make_shared<Dropout>(config.dropout, dropout_gen));
}

Tensor MLP::forward(const Tensor& x) {
  // c_proj(gelu(c_fc(x))) as one op: the bias and GELU in c_fc's product, the GELU's gradient in c_proj's.
  return dropout_->forward(ops::linear_gelu_linear(x, c_fc->weight, c_fc->bias, c_proj->weight, c_proj->bias));
}

Branch MLP::forward_branch(const Tensor& x) {
  if (!passes_through(*dropout_)) return {forward(x), Tensor()};
  return {ops::linear_gelu_linear(x, c_fc->weight, c_fc->bias, c_proj->weight, Tensor()), c_proj->bias};
}

Block::Block(const TransformerConfig& config, Generator* dropout_gen) : Module("Block") {
  ln_1 = register_module("ln_1", std::make_shared<LayerNorm>(config.n_embd, config.bias));
  attn = register_module("attn", std::make_shared<CausalSelfAttention>(config, dropout_gen));
  ln_2 = register_module("ln_2", std::make_shared<LayerNorm>(config.n_embd, config.bias));
  mlp = register_module("mlp", std::make_shared<MLP>(config, dropout_gen));
}

Tensor Residual::value() const {
  Tensor sum = branch.defined() ? stream + branch : stream;
  return branch_bias.defined() ? sum + branch_bias.to(sum.dtype()) : sum;  // as add_layer_norm's sum
}

Tensor Block::forward(const Tensor& x) { return forward(Residual{x, Tensor(), Tensor()}).value(); }

Residual Block::forward(const Residual& in) {
  gate_parameters(*this);  // the block's parameters, all of them, before its first norm
  // Both norms feed linears (c_attn, c_fc): under autocast they store their result in the
  // compute dtype, the values those linears would cast it to, with no cast of their own.
  const std::optional<DType> to_linear = ops::autocast::linear_input_dtype();
  // x = stream + the previous block's pending branch, and ln_1(x), in one op (one pass each way on the GPU).
  ops::AddLayerNorm x{in.stream, Tensor()};
  if (in.branch.defined()) {
    x = ops::add_layer_norm(in.stream, in.branch, ln_1->weight, ln_1->bias, ln_1->eps, to_linear, in.branch_bias);
  } else {
    x.normed = ops::layer_norm(in.stream, ln_1->weight, ln_1->bias, ln_1->eps, to_linear);
  }
  const Branch a = attn->forward_branch(x.normed);
  // h = x + a and ln_2(h) in one op.
  const ops::AddLayerNorm h =
      ops::add_layer_norm(x.sum, a.value, ln_2->weight, ln_2->bias, ln_2->eps, to_linear, a.bias);
  const Branch m = mlp->forward_branch(h.normed);
  return {h.sum, m.value, m.bias};
}

}  // namespace precis::nn
