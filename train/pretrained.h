// model.init_from: a GPT-2 to start training from (fine-tuning), in any of
//   - a Hugging Face folder as save_pretrained writes it (config.json + model.safetensors),
//   - a Precis checkpoint: a run folder, its checkpoint directory or a step folder (the
//     weights only: the optimizer, the data position and the step start fresh, unlike resume),
//   - an llm.c model file (gpt2_124M.bin in fp32, gpt2_124M_bf16.bin in bf16).
// The model's shape comes from the file.
//
// llm.c's file (train_gpt2.py's write_model): a header of 256 int32 — magic 20240326,
// version (3: fp32, 5: bf16), max_seq_len, vocab_size, n_layer, n_head, n_embd,
// padded_vocab_size — then the tensors back to back in this order, each layer's kind for all
// layers together, Linear weights as [out, in]:
//   wte [Vp, C], wpe [maxT, C], ln_1.weight [L, C], ln_1.bias [L, C], c_attn.weight [L, 3C, C],
//   c_attn.bias [L, 3C], attn.c_proj.weight [L, C, C], attn.c_proj.bias [L, C], ln_2.weight,
//   ln_2.bias [L, C], c_fc.weight [L, 4C, C], c_fc.bias [L, 4C], mlp.c_proj.weight [L, C, 4C],
//   mlp.c_proj.bias [L, C], ln_f.weight [C], ln_f.bias [C]
#pragma once

#include <string>
#include <vector>

#include "models/gpt2.h"
#include "nn/module.h"

namespace precis::train {

inline constexpr int32_t kLlmcMagic = 20240326;

struct PretrainedSource {
  std::string path;    // where the weights are: a step folder, a .safetensors or a .bin file
  std::string format;  // "Hugging Face / Precis checkpoint" or "llm.c"
  models::GPT2Config config;
};

// The checkpoint directory of a run folder (out_dir with checkpoints/latest), else `path`.
std::string run_checkpoint_path(const std::string& path);

// Finds the weights at `path` and reads their model shape (not the weights); errors say what
// is missing and which forms are accepted.
PretrainedSource inspect_pretrained(const std::string& path);
// Copies the weights into `model`, which must have the source's shape.
void load_pretrained(const PretrainedSource& source, models::GPT2& model);

// An llm.c model file: its shape, and its tensors under Hugging Face's names and layouts
// (what load_hf_state_dict takes; wte without the padded rows).
models::GPT2Config read_llmc_config(const std::string& path);
std::vector<nn::NamedTensor> read_llmc_weights(const std::string& path);

}  // namespace precis::train
