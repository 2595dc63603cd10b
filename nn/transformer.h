// The GPT-2 transformer pieces: causal self-attention, MLP, and the pre-norm block.
// Member names follow Hugging Face's GPT-2 (c_attn, c_proj, c_fc, ln_1, ln_2),
// so state_dict names map one to one onto its checkpoints.
#pragma once

#include <memory>
#include <string>

#include "core/random.h"
#include "nn/layers.h"
#include "nn/linear.h"
#include "ops/nn_functional.h"

namespace precis::nn {

// A residual branch with its last bias possibly not yet added: the branch is value + bias
// (bias undefined: value alone). The norm that adds the branch to the residual stream adds
// the bias in the same pass (ops::add_layer_norm's residual_bias), and its gradient is one
// more column sum of that norm's backward instead of a pass over the gradient of its own.
struct Branch {
  Tensor value, bias;
};

struct TransformerConfig {
  int64_t n_embd = 768;
  int64_t n_head = 12;
  double dropout = 0.0;
  bool bias = true;
  std::string attention = "flash";  // "flash" (fused kernel where it can run, else reference) or "reference"
};

class CausalSelfAttention : public Module {
 public:
  CausalSelfAttention(const TransformerConfig& config, Generator* dropout_gen = nullptr);
  // x: [B, T, C] -> [B, T, C]
  Tensor forward(const Tensor& x) override;
  // The same with c_proj's bias left to the caller where no dropout follows it (dropout(z + b)
  // is not dropout(z) + b): {c_proj's product, its bias}, else {forward(x), none}.
  Branch forward_branch(const Tensor& x);

  std::shared_ptr<Linear> c_attn;  // C -> 3C: q, k, v in one product
  std::shared_ptr<Linear> c_proj;  // C -> C

 private:
  ops::AttentionImpl attention_impl(const Tensor& q, double dropout_p) const;
  bool packed_flash_runs(const Tensor& x, double dropout_p) const;
  Tensor attend(const Tensor& x);  // the heads' outputs, [B, T, C], before c_proj

  TransformerConfig config_;
  std::shared_ptr<Dropout> resid_dropout_;
  Generator* dropout_gen_;
};

class MLP : public Module {
 public:
  explicit MLP(const TransformerConfig& config, Generator* dropout_gen = nullptr);
  Tensor forward(const Tensor& x) override;
  // As CausalSelfAttention::forward_branch: c_proj's bias left to the caller where no dropout follows.
  Branch forward_branch(const Tensor& x);

  std::shared_ptr<Linear> c_fc;    // C -> 4C
  std::shared_ptr<Linear> c_proj;  // 4C -> C

 private:
  std::shared_ptr<Dropout> dropout_;
};

// The residual stream between blocks, with the last branch not yet added to it: the next
// block adds it in the same pass as its first layer norm (ops::add_layer_norm), so the sum
// costs no pass of its own. branch undefined: nothing pending; the stream is the value.
// branch_bias: the branch's bias, not yet added to it either (Branch), or undefined.
struct Residual {
  Tensor stream, branch, branch_bias;
  Tensor value() const;  // stream + branch + branch_bias
};

// x = x + attn(ln_1(x)); x = x + mlp(ln_2(x))
class Block : public Module {
 public:
  explicit Block(const TransformerConfig& config, Generator* dropout_gen = nullptr);
  Tensor forward(const Tensor& x) override;
  // The same on a residual stream with a pending branch: returns {x + attn(...), mlp(...)},
  // the mlp branch left pending for the next block's ln_1 (or the model's final norm), and
  // c_proj's biases added by the norms that add their branches (where no dropout follows them).
  Residual forward(const Residual& in);

  std::shared_ptr<LayerNorm> ln_1;
  std::shared_ptr<CausalSelfAttention> attn;
  std::shared_ptr<LayerNorm> ln_2;
  std::shared_ptr<MLP> mlp;
};

}  // namespace precis::nn
