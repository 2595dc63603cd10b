// Checkpoints (docs/architecture.md, "Errors, checkpoints").
//
// A checkpoint directory holds one folder per saved step and a pointer to the newest:
//
//   dir/latest                               "step_00001000" (replaced atomically)
//   dir/step_00001000/model.safetensors      weights, Hugging Face GPT2LMHeadModel layout
//   dir/step_00001000/config.json            the model configuration (GPT2Config::to_json: Hugging Face's keys)
//   dir/step_00001000/train_state.safetensors  optimizer state ("optimizer.<key>" tensors) and
//                                            the trainer's JSON state (metadata "train_state")
//
// Every file is written to a temporary name and renamed; a step folder is
// written as step_XXXXXXXX.tmp and renamed when complete; `latest` moves only
// after that. A crash at any point leaves the previous checkpoint loadable.
//
// A step folder loads in transformers (GPT2LMHeadModel.from_pretrained(folder)
// when bias is on, as HF's GPT-2 always has biases): HF's Conv1D weights (attn.c_attn, attn.c_proj,
// mlp.c_fc, mlp.c_proj) are stored [in, out], the transpose of our Linear, and
// the token embedding has only the real vocab_size rows, not the padded ones.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "core/json.h"
#include "models/gpt2.h"
#include "nn/module.h"
#include "optim/optimizer.h"

namespace precis::train {

// The model's weights under Hugging Face GPT-2 names and layouts. The transposed
// Conv1D weights are host copies; the others are views of the parameters, on their device.
std::vector<nn::NamedTensor> hf_state_dict(models::GPT2& model);

// The inverse of hf_state_dict: checks every name and shape first (errors name the
// tensor and both shapes, and list missing and unexpected tensors), then copies
// the values in, converted to each parameter's dtype and device, with padded
// vocabulary rows set to zero. Also accepts Hugging Face's own files: names
// without the "transformer." prefix, the attn.bias / attn.masked_bias mask
// buffers (ignored), and lm_head.weight beside tied embeddings when it equals wte.
void load_hf_state_dict(models::GPT2& model, const std::vector<nn::NamedTensor>& tensors);

// "step_00001000"
std::string checkpoint_step_name(int64_t step);

// What a checkpoint holds of a model, for any model: the tensors of model.safetensors
// (in the names and layouts of the model's reference implementation), config.json,
// and how to load the tensors back and check a saved config against the model.
struct CheckpointModel {
  std::function<std::vector<nn::NamedTensor>()> tensors;
  std::function<Json()> config;
  // Checks every name and shape before changing anything; errors name the tensors.
  std::function<void(const std::vector<nn::NamedTensor>&)> load;
  // Throws when a saved config.json does not describe the model; may be empty.
  std::function<void(const Json& saved, const std::string& source)> check_config;
};

// GPT-2's: Hugging Face's layout (hf_state_dict, load_hf_state_dict) and GPT2Config's JSON.
CheckpointModel gpt2_checkpoint_model(models::GPT2& model);
// A module's state_dict (parameters and buffers by their dotted names, as PyTorch's
// state_dict) loaded with load_state_dict; `config` is config.json.
CheckpointModel module_checkpoint_model(nn::Module& model, Json config);

// Writes dir/step_XXXXXXXX/ (see above), points dir/latest at it, then deletes
// the step folders older than the newest `keep_last` (keep_last <= 0 keeps all;
// folders of later steps, from another run, are left alone). `optimizer` may
// be null (weights only). Call it from one process (rank 0). Returns the step folder's path.
std::string save_checkpoint(const std::string& dir, int64_t step, models::GPT2& model,
                            const optim::Optimizer* optimizer, const Json& train_state, int64_t keep_last);
// The same with the optimizer's state given as Optimizer::state_dict() would give it (ZeRO-1:
// the state gathered from the ranks' shards, distributed/zero.h).
std::string save_checkpoint(const std::string& dir, int64_t step, models::GPT2& model,
                            const std::map<std::string, Tensor>& optimizer_state, const Json& train_state,
                            int64_t keep_last);

// The step folder a path names: a checkpoint directory with `latest` (followed),
// or a step folder itself. Errors say what is missing.
std::string resolve_checkpoint(const std::string& path_or_dir);

// Whether `dir` holds a checkpoint to resume from (a `latest` file).
bool has_checkpoint(const std::string& dir);

// Loads the weights into `model` and, when `optimizer` is not null, its state;
// returns the trainer's JSON state (an empty object for weights-only checkpoints).
// `path_or_dir`: a checkpoint directory, a step folder, or a bare model
// .safetensors file (weights only, as Hugging Face publishes them).
Json load_checkpoint(const std::string& path_or_dir, models::GPT2& model, optim::Optimizer* optimizer = nullptr);
// The same with the optimizer's state handed, as Optimizer::state_dict() gave it, to
// `load_optimizer` (ZeRO-1: which cuts this rank's shard out of it) instead of an optimizer;
// its errors are reported as the checkpoint's.
using OptimizerStateLoader = std::function<void(const std::map<std::string, Tensor>& state)>;
Json load_checkpoint_into(const std::string& path_or_dir, models::GPT2& model,
                          const OptimizerStateLoader& load_optimizer);

// The forms of save_checkpoint and load_checkpoint above for any model (the GPT-2 ones call these).
std::string save_checkpoint(const std::string& dir, int64_t step, const CheckpointModel& model,
                            const optim::Optimizer* optimizer, const Json& train_state, int64_t keep_last);
std::string save_checkpoint(const std::string& dir, int64_t step, const CheckpointModel& model,
                            const std::map<std::string, Tensor>& optimizer_state, const Json& train_state,
                            int64_t keep_last);
Json load_checkpoint(const std::string& path_or_dir, const CheckpointModel& model,
                     optim::Optimizer* optimizer = nullptr);
Json load_checkpoint_into(const std::string& path_or_dir, const CheckpointModel& model,
                          const OptimizerStateLoader& load_optimizer);

// The trainer's JSON state of a checkpoint (as load_checkpoint returns it) read without
// loading anything: an empty object for weights-only checkpoints.
Json read_train_state(const std::string& path_or_dir);

// The model configuration stored beside a checkpoint's weights (the config.json
// of its step folder, or beside a bare .safetensors file), so `sample` can build
// the model without the training YAML; nullopt when there is none.
std::optional<models::GPT2Config> checkpoint_model_config(const std::string& path_or_dir);

}  // namespace precis::train
