#include "models/gpt2.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/autograd.h"
#include "core/copy.h"
#include "core/philox.h"
#include "nn/init.h"
#include "nn/observer.h"
#include "nn/parameter_gate.h"
#include "ops/autocast.h"
#include "ops/ops.h"

namespace precis::models {

namespace {
// A module that only holds children, for the `transformer.` name prefix.
class Container : public nn::Module {
 public:
  Container() : nn::Module("GPT2Transformer") {}
};
class LMHead : public nn::Module {
 public:
  LMHead(int64_t vocab, int64_t dim) : nn::Module("LMHead") {
    weight = register_parameter("weight", zeros({vocab, dim}), /*weight_decay=*/true);
  }
  Tensor weight;
};
}  // namespace

GPT2::GPT2(const GPT2Config& config, uint64_t seed) : nn::Module("GPT2"), config_(config), dropout_gen_(seed + 1) {
  PRECIS_CHECK(config.vocab_size > 0 && config.block_size > 0 && config.n_layer > 0, "GPT2: vocab_size (",
               config.vocab_size, "), block_size (", config.block_size, ") and n_layer (", config.n_layer,
               ") must be positive");
  const int64_t Vp = config.padded_vocab_size(), C = config.n_embd;
  nn::TransformerConfig block_config{C, config.n_head, config.dropout, config.bias, config.attention};

  transformer_ = register_module("transformer", std::make_shared<Container>());
  wte_ = transformer_->register_module("wte", std::make_shared<nn::Embedding>(Vp, C));
  wpe_ = transformer_->register_module("wpe", std::make_shared<nn::Embedding>(config.block_size, C));
  drop_ = transformer_->register_module("drop", std::make_shared<nn::Dropout>(config.dropout, &dropout_gen_));
  h_ = transformer_->register_module("h", std::make_shared<nn::ModuleList>());
  for (int64_t i = 0; i < config.n_layer; ++i) h_->push_back(std::make_shared<nn::Block>(block_config, &dropout_gen_));
  ln_f_ = transformer_->register_module("ln_f", std::make_shared<nn::LayerNorm>(C, config.bias));
  if (!config.tie_embeddings) {
    auto head = std::make_shared<LMHead>(Vp, C);
    lm_head_module_ = register_module("lm_head", std::static_pointer_cast<nn::Module>(head));
    lm_head_ = head->weight;
  }

  // Initialisation, in parameter order from one seeded generator.
  Generator gen(seed);
  const double std_residual = 0.02 / std::sqrt(2.0 * static_cast<double>(config.n_layer));
  for (const auto& [name, p] : named_parameters()) {
    bool is_residual_proj = name.ends_with("attn.c_proj.weight") || name.ends_with("mlp.c_proj.weight");
    if (name.ends_with(".bias")) {
      nn::init::zeros_(p);
    } else if (name.find(".ln_") != std::string::npos) {
      nn::init::ones_(p);
    } else {
      nn::init::normal_(p, 0.0, is_residual_proj ? std_residual : 0.02, &gen);
    }
  }
  // Padded vocabulary rows are never looked up or scored: keep them zero.
  if (Vp > config.vocab_size) {
    fill_(wte().slice(0, config.vocab_size, Vp), 0.0);
    if (lm_head_.defined()) fill_(lm_head_.slice(0, config.vocab_size, Vp), 0.0);
  }
}

int64_t GPT2::num_parameters_unpadded() const {
  int64_t padding = (config_.padded_vocab_size() - config_.vocab_size) * config_.n_embd;
  return num_parameters() - padding * (config_.tie_embeddings ? 1 : 2);
}

Tensor GPT2::hidden_states(const Tensor& idx) {
  PRECIS_CHECK(idx.dim() == 2, "GPT2: idx must be [B, T], got ", idx.shape());
  const int64_t T = idx.size(1);
  PRECIS_CHECK(T <= config_.block_size, "GPT2: sequence length ", T, " exceeds block_size ", config_.block_size);
  if (!positions_.defined() || positions_.device() != idx.device())
    positions_ = arange(0, config_.block_size, 1, DType::i64).to(idx.device());
  nn::gate_parameters(*wte_);  // each block gates its own (nn::Block::forward)
  nn::gate_parameters(*wpe_);
  Tensor x = ops::embedding(wte(), idx) + ops::embedding(wpe(), positions_.narrow(0, 0, T));
  x = drop_->forward(x);
  // Each block leaves its mlp branch pending; the next norm adds it in its own pass.
  nn::Residual r{x, Tensor(), Tensor()};
  for (size_t i = 0; i < h_->size(); ++i) {
    r = h_->at<nn::Block>(i).forward(r);
    if (nn::observing()) r = {nn::observe("transformer.h." + std::to_string(i), r.value()), Tensor(), Tensor()};
  }
  // The classifier reads it: under autocast stored in the compute dtype, as its cast would make it.
  const std::optional<DType> to_linear = ops::autocast::linear_input_dtype();
  nn::gate_parameters(*ln_f_);
  if (!r.branch.defined()) return ops::layer_norm(r.stream, ln_f_->weight, ln_f_->bias, ln_f_->eps, to_linear);
  return ops::add_layer_norm(r.stream, r.branch, ln_f_->weight, ln_f_->bias, ln_f_->eps, to_linear, r.branch_bias)
      .normed;
}

void GPT2Output::backward() const {
  PRECIS_CHECK(fused_classifier(),
               "GPT2Output::backward: only for a forward given a loss gradient (the fused "
               "classifier); otherwise call loss.backward()");
  autograd::backward(classifier_output, classifier_grad, false);
}

GPT2Output GPT2::forward(const Tensor& idx, const Tensor& targets, const Tensor& loss_gradient) {
  Tensor x = hidden_states(idx);
  GPT2Output out;
  // The product runs at the padded width (rows of a multiple of 64 values: aligned for any
  // dtype, and the weight is the whole parameter, whose autocast cast is cached); only the
  // real vocabulary's columns are shown, and scored.
  const int64_t V = config_.vocab_size, Vp = config_.padded_vocab_size();
  nn::gate_parameters(lm_head_module_ ? *lm_head_module_ : *wte_);  // wte: tied, already waited for
  const Tensor padded = ops::linear(x, lm_head_weight());
  out.logits = padded.narrow(-1, 0, V);
  if (nn::observing()) out.logits = nn::observe("logits", out.logits);
  if (targets.defined()) {
    PRECIS_CHECK(targets.shape() == idx.shape(), "GPT2: targets ", targets.shape(), " must match idx ", idx.shape());
    // The loss reads the real columns of the padded rows in place and writes its gradient at
    // the padded width, zeros in the padding, so nothing is copied or scattered. (The
    // numerics report scores the observed logits, so that their gradient passes its tap.)
    const Tensor flat_targets = targets.reshape({-1});
    if (loss_gradient.defined() && padded.requires_grad() && !nn::observing()) {
      ops::LossAndGradient fused = ops::cross_entropy_with_grad(padded.reshape({-1, Vp}), flat_targets, loss_gradient,
                                                                -100, V, /*overwrite_logits=*/true);
      out.logits = Tensor();  // its memory now holds the gradient
      out.loss = fused.loss;
      out.classifier_output = padded;
      out.classifier_grad = fused.grad.view(padded.shape());
      return out;
    }
    out.loss = nn::observing() ? ops::cross_entropy(out.logits.reshape({-1, V}), flat_targets)
                               : ops::cross_entropy(padded.reshape({-1, Vp}), flat_targets, -100, V);
  }
  return out;
}

std::vector<int32_t> GPT2::generate(const std::vector<int32_t>& prompt, int64_t max_new_tokens, double temperature,
                                    int64_t top_k, uint64_t seed) {
  PRECIS_CHECK(!prompt.empty(), "generate: the prompt must hold at least one token");
  PRECIS_CHECK(temperature > 0, "generate: temperature must be > 0, got ", temperature);
  NoGradGuard no_grad;
  bool was_training = is_training();
  eval();
  Device device = wte().device();
  std::vector<int32_t> tokens = prompt;
  Generator gen(seed);
  for (int64_t step = 0; step < max_new_tokens; ++step) {
    int64_t start = std::max<int64_t>(0, static_cast<int64_t>(tokens.size()) - config_.block_size);
    std::vector<int32_t> window(tokens.begin() + start, tokens.end());
    Tensor idx = from_vector(window, {1, static_cast<int64_t>(window.size())}).to(device);
    // Only the last position's logits are needed.
    Tensor last = hidden_states(idx).select(1, -1);
    Tensor logits = ops::linear(last, lm_head_weight().slice(0, 0, config_.vocab_size)).select(0, 0);
    std::vector<double> scores = logits.to_vector<double>();
    // Keep the top_k scores, turn them into probabilities at the temperature.
    std::vector<int64_t> order(scores.size());
    std::iota(order.begin(), order.end(), 0);
    int64_t keep = top_k > 0 ? std::min<int64_t>(top_k, scores.size()) : scores.size();
    std::partial_sort(order.begin(), order.begin() + keep, order.end(),
                      [&](int64_t a, int64_t b) { return scores[a] > scores[b]; });
    double max_score = scores[order[0]];
    std::vector<double> probs(keep);
    double total = 0;
    for (int64_t i = 0; i < keep; ++i) total += probs[i] = std::exp((scores[order[i]] - max_score) / temperature);
    double u = uniform_from_bits(philox_word(gen.seed(), gen.reserve(1), 0)) * total;
    int64_t pick = keep - 1;
    for (int64_t i = 0; i < keep; ++i) {
      if (u < probs[i]) {
        pick = i;
        break;
      }
      u -= probs[i];
    }
    tokens.push_back(static_cast<int32_t>(order[pick]));
  }
  train(was_training);
  return std::vector<int32_t>(tokens.begin() + prompt.size(), tokens.end());
}

}  // namespace precis::models
