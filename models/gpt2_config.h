// GPT2Config: the sizes and switches of a GPT-2 model, its named presets, and its one
// JSON form, which is Hugging Face's config.json for GPT-2 (so a checkpoint folder loads
// in transformers, and Hugging Face's own config.json loads here).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/json.h"

namespace precis::models {

struct GPT2Config {
  int64_t vocab_size = 50257;  // char-level data sets this from the text
  int64_t block_size = 1024;   // the longest context (size of the position embedding)
  int64_t n_layer = 12;
  int64_t n_head = 12;
  int64_t n_embd = 768;
  double dropout = 0.0;
  bool bias = true;
  bool tie_embeddings = true;
  int64_t vocab_multiple = 64;      // the embedding is padded to a multiple of this
  std::string attention = "flash";  // flash (where it can run) | reference: how to run, not what to store

  int64_t padded_vocab_size() const { return (vocab_size + vocab_multiple - 1) / vocab_multiple * vocab_multiple; }
  // Forward FLOPs per token (matmuls only, as in the PaLM appendix): 2 N + 2 n_layer T C.
  double flops_per_token_forward(int64_t seq_len) const;

  // gpt2 (124M), gpt2-medium (350M), gpt2-large (774M), gpt2-xl (1558M): the family as
  // released by OpenAI, the other fields at their defaults (GPT-2's vocabulary and context).
  static GPT2Config preset(const std::string& name);
  static const std::vector<std::string>& preset_names();  // in size order

  // Hugging Face GPT2Config keys (vocab_size, n_positions, n_embd, n_layer, n_head,
  // tie_word_embeddings, resid/embd/attn_pdrop, ...) plus Precis' "bias" and "vocab_multiple".
  // `attention` is not stored: it is how this machine runs the model.
  Json to_json() const;
  // Reads those keys back (dropout from "resid_pdrop"); a missing "bias", "vocab_multiple",
  // "tie_word_embeddings" or "resid_pdrop" keeps the default above, so Hugging Face's own
  // config.json reads too. Errors name `source` and the key.
  static GPT2Config from_json(const Json& json, const std::string& source = "config.json");

  bool operator==(const GPT2Config&) const = default;
};

}  // namespace precis::models
