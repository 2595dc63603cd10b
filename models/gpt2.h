// GPT-2 (Radford et al. 2019), laid out as Hugging Face's GPT2LMHeadModel so
// that parameter names match its checkpoints: transformer.wte, transformer.wpe,
// transformer.h.N.{ln_1, attn.c_attn, attn.c_proj, ln_2, mlp.c_fc, mlp.c_proj},
// transformer.ln_f, and the output projection tied to wte.
//
// The token embedding is padded to a multiple of 64 rows (50257 -> 50304) so the
// classifier matmul has friendly sizes; the loss reads only the real columns of the
// padded logits and the returned logits are a view of them, so the padding is never
// scored or sampled.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/random.h"
#include "models/gpt2_config.h"
#include "nn/containers.h"
#include "nn/layers.h"
#include "nn/transformer.h"

namespace precis::models {

struct GPT2Output {
  Tensor logits;  // [B, T, vocab_size]: a view of the padded logits, rows padded_vocab_size() apart
  Tensor loss;    // scalar mean cross-entropy, when targets were given
  // With the fused classifier (forward given a loss gradient): the loss has no grad_fn; the
  // gradient of loss_gradient * loss with respect to the padded logits was made in the
  // loss's own pass over them, written over them (so `logits` is undefined), and the
  // backward starts there: backward() runs autograd::backward(classifier_output, classifier_grad).
  Tensor classifier_output, classifier_grad;
  bool fused_classifier() const { return classifier_grad.defined(); }
  void backward() const;
};

class GPT2 : public nn::Module {
 public:
  // Initialises as GPT-2/nanoGPT: N(0, 0.02) weights, residual projections
  // (attn.c_proj, mlp.c_proj) N(0, 0.02 / sqrt(2 n_layer)), zero biases, unit LayerNorms.
  explicit GPT2(const GPT2Config& config, uint64_t seed = 1337);

  // idx: [B, T] token ids (i32/i64), T <= block_size; targets: [B, T] or undefined.
  // loss_gradient (a scalar on the model's device, with targets, while recording autograd):
  // the gradient the loss will receive (loss scale / micro-batches); the loss and the logits'
  // gradient are then made in one pass (ops::cross_entropy_with_grad; see GPT2Output).
  GPT2Output forward(const Tensor& idx, const Tensor& targets = Tensor(), const Tensor& loss_gradient = Tensor());
  // The final hidden states [B, T, C] (after ln_f), before the classifier; in the compute
  // dtype under autocast (what the classifier reads).
  Tensor hidden_states(const Tensor& idx);
  // Samples max_new_tokens tokens after `prompt` (softmax at `temperature`, kept to
  // the top_k most likely when top_k > 0), reproducibly for a seed.
  std::vector<int32_t> generate(const std::vector<int32_t>& prompt, int64_t max_new_tokens, double temperature = 1.0,
                                int64_t top_k = 0, uint64_t seed = 0);

  const GPT2Config& config() const { return config_; }
  // Parameters without the padded embedding rows (the count GPT-2's paper reports).
  int64_t num_parameters_unpadded() const;

  Tensor& wte() { return wte_->weight; }
  Tensor& wpe() { return wpe_->weight; }
  // The logits' weight: wte when tied, else lm_head.weight.
  Tensor& lm_head_weight() { return lm_head_.defined() ? lm_head_ : wte_->weight; }
  Generator& dropout_generator() { return dropout_gen_; }

 private:
  GPT2Config config_;
  Generator dropout_gen_;
  std::shared_ptr<nn::Module> transformer_;
  std::shared_ptr<nn::Embedding> wte_, wpe_;
  std::shared_ptr<nn::ModuleList> h_;
  std::shared_ptr<nn::LayerNorm> ln_f_;
  std::shared_ptr<nn::Dropout> drop_;
  std::shared_ptr<nn::Module> lm_head_module_;
  Tensor lm_head_;
  // 0 .. block_size - 1 (i64) on the device of the last forward: made once, so a step copies
  // nothing from the host (and a CUDA graph can capture the forward).
  Tensor positions_;
};

}  // namespace precis::models
