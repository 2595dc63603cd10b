#include "train/checkpoint.h"

#include <fcntl.h>
#include <stdio.h>  // renameat2
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "core/autograd.h"
#include "core/copy.h"
#include "train/exit_codes.h"
#include "train/nonfinite.h"
#include "train/safetensors.h"

namespace precis::train {

namespace {

namespace fs = std::filesystem;

constexpr const char* kModelFile = "model.safetensors";
constexpr const char* kTrainStateFile = "train_state.safetensors";
constexpr const char* kConfigFile = "config.json";
constexpr const char* kLatestFile = "latest";
constexpr const char* kOptimizerPrefix = "optimizer.";

// Hugging Face's GPT-2 uses Conv1D (weight [in, out]) where we use Linear (weight [out, in]).
bool is_conv1d_weight(const std::string& name) {
  for (const char* suffix : {".attn.c_attn.weight", ".attn.c_proj.weight", ".mlp.c_fc.weight", ".mlp.c_proj.weight"})
    if (name.ends_with(suffix)) return true;
  return false;
}

bool is_vocab_padded(const std::string& name) { return name == "transformer.wte.weight" || name == "lm_head.weight"; }

// GPT2LMHeadModel's name for a tensor: HF's GPT2Model files drop the "transformer." prefix.
std::string hf_key(const std::string& name) {
  return name.starts_with("transformer.") || name.starts_with("lm_head.") ? name : "transformer." + name;
}

// HF files also hold each layer's causal mask buffers ("h.N.attn.bias", "h.N.attn.masked_bias").
bool is_hf_mask_buffer(const std::string& name) {
  return name.starts_with("transformer.h.") && (name.ends_with(".attn.bias") || name.ends_with(".attn.masked_bias"));
}

// The shape a parameter has in the HF layout.
Shape hf_shape(const std::string& name, const Tensor& param, int64_t vocab_size) {
  if (is_vocab_padded(name)) return {vocab_size, param.size(1)};
  if (is_conv1d_weight(name)) return {param.size(1), param.size(0)};
  return param.shape();
}

std::string describe_config(const models::GPT2Config& c) {
  return detail::concat("vocab_size=", c.vocab_size, ", block_size=", c.block_size, ", n_layer=", c.n_layer,
                        ", n_head=", c.n_head, ", n_embd=", c.n_embd, ", bias=", c.bias ? "true" : "false",
                        ", tie_embeddings=", c.tie_embeddings ? "true" : "false");
}

std::string join(const std::vector<std::string>& items, size_t limit = 8) {
  std::string s;
  for (size_t i = 0; i < items.size() && i < limit; ++i) s += (i ? ", " : "") + items[i];
  if (items.size() > limit) s += ", ... (" + std::to_string(items.size()) + " in all)";
  return s;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype() || a.shape() != b.shape()) return false;
  Tensor ha = empty(a.shape(), a.dtype()), hb = empty(b.shape(), b.dtype());
  copy_(ha, a.detach().contiguous());
  copy_(hb, b.detach().contiguous());
  return ha.nbytes() == 0 || std::memcmp(ha.raw_data(), hb.raw_data(), ha.nbytes()) == 0;
}

void fsync_directory(const fs::path& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) return;  // best effort: some file systems do not allow opening directories
  ::fsync(fd);
  ::close(fd);
}

// Writes `text` to path.tmp, fsyncs it and renames it over `path`.
void write_text_file(const fs::path& path, const std::string& text) {
  const std::string tmp = path.string() + ".tmp";
  std::FILE* file = std::fopen(tmp.c_str(), "wb");
  PRECIS_CHECK(file, "checkpoint: cannot create '", tmp, "': ", std::strerror(errno));
  bool written = std::fwrite(text.data(), 1, text.size(), file) == text.size() && std::fflush(file) == 0 &&
                 ::fsync(::fileno(file)) == 0;
  int error = errno;
  if (std::fclose(file) != 0 && written) written = false, error = errno;
  if (written && std::rename(tmp.c_str(), path.c_str()) == 0) return fsync_directory(path.parent_path());
  if (written) error = errno;
  std::error_code ignored;
  fs::remove(tmp, ignored);
  PRECIS_FAIL("checkpoint: writing '", path.string(), "' failed: ", std::strerror(error));
}

std::string read_text_file(const fs::path& path) {
  std::ifstream file(path, std::ios::binary);
  PRECIS_CHECK(file, "checkpoint: cannot read '", path.string(), "': ", std::strerror(errno));
  std::string text((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  return text;
}

// Puts the finished folder `tmp` at `target`. When `target` exists (the same step
// saved again), the two are swapped atomically where the file system allows it.
void install_directory(const fs::path& tmp, const fs::path& target) {
  std::error_code ec;
  if (fs::exists(target, ec)) {
    if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, target.c_str(), RENAME_EXCHANGE) == 0) {
      fs::remove_all(tmp, ec);
      return;
    }
    fs::remove_all(target, ec);
    PRECIS_CHECK(!ec, "checkpoint: cannot replace '", target.string(), "': ", ec.message());
  }
  fs::rename(tmp, target, ec);
  PRECIS_CHECK(!ec, "checkpoint: cannot rename '", tmp.string(), "' to '", target.string(), "': ", ec.message());
}

// The step of a folder named step_<digits>, or -1.
int64_t parse_step_name(const std::string& name) {
  if (!name.starts_with("step_") || name.size() == 5 || name.size() > 5 + 18) return -1;
  int64_t step = 0;
  for (size_t i = 5; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return -1;
    step = step * 10 + (name[i] - '0');
  }
  return step;
}

// Deletes step folders at or below `current` beyond the newest `keep_last`, and
// leftover .tmp folders of interrupted saves.
void prune_checkpoints(const fs::path& dir, int64_t current, int64_t keep_last) {
  std::vector<std::pair<int64_t, fs::path>> steps;
  std::vector<fs::path> leftovers;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (!entry.is_directory()) continue;
    std::string name = entry.path().filename().string();
    if (name.ends_with(".tmp") && parse_step_name(name.substr(0, name.size() - 4)) >= 0) {
      leftovers.push_back(entry.path());
    } else if (int64_t step = parse_step_name(name); step >= 0 && step <= current) {
      steps.emplace_back(step, entry.path());
    }
  }
  for (const auto& path : leftovers) fs::remove_all(path);
  if (keep_last <= 0) return;
  std::sort(steps.begin(), steps.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  for (size_t i = static_cast<size_t>(keep_last); i < steps.size(); ++i) fs::remove_all(steps[i].second);
}

// A checkpoint with an inf or NaN would resume into garbage and, through keep_last, push out
// the good ones: nothing is written (and nothing pruned) when any value is not finite.
void check_finite_before_saving(const std::string& dir, int64_t step, const std::vector<nn::NamedTensor>& weights,
                                const std::vector<nn::NamedTensor>& state) {
  for (const auto* group : {&weights, &state})
    for (const auto& [name, t] : *group)
      if (int64_t i = first_nonfinite(t); i >= 0)
        throw StoppedRun(detail::concat("checkpoint: not writing step ", step, " to '", dir, "': '", name,
                                        "' holds inf or NaN (element ", i, ")",
                                        has_checkpoint(dir) ? "; the newest checkpoint, " + resolve_checkpoint(dir) +
                                                                  ", is kept and has finite weights"
                                                            : "",
                                        ". The run diverged: lower optimizer.lr or set optimizer.grad_clip"),
                         kExitNonFinite);
}

// Loaded values must be finite: a NaN in a checkpoint is damage (checkpoints are checked before
// they are written), and it would resume or sample garbage.
void check_finite_after_loading(const std::string& file, const std::vector<nn::NamedTensor>& tensors) {
  for (const auto& [name, t] : tensors)
    if (int64_t i = first_nonfinite(t); i >= 0)
      PRECIS_FAIL("checkpoint '", file, "': tensor '", name, "' holds inf or NaN (element ", i,
                  "); the file is damaged. Use an older checkpoint (the step_XXXXXXXX folders beside it)");
}

void load_weights_file(const std::string& file, const CheckpointModel& model) {
  SafetensorsFile weights = read_safetensors(file);
  check_finite_after_loading(file, weights.tensors);
  try {
    model.load(weights.tensors);
  } catch (const Error& e) {
    PRECIS_FAIL("checkpoint '", file, "': ", e.what());
  }
}

// The config.json beside a weights file or in a step folder.
fs::path config_path_for(const std::string& step_folder_or_file) {
  fs::path p(step_folder_or_file);
  return fs::is_directory(p) ? p / kConfigFile : p.parent_path() / kConfigFile;
}

// Compares the recorded configuration with the model's; shapes cannot tell n_head apart.
void check_config(const std::string& source, const models::GPT2Config& saved, const models::GPT2Config& model) {
  std::vector<std::string> diffs;
  auto compare = [&](const char* key, int64_t a, int64_t b) {
    if (a != b) diffs.push_back(detail::concat(key, " ", a, " (checkpoint) vs ", b, " (model)"));
  };
  auto compare_flag = [&](const char* key, bool a, bool b) {
    if (a != b)
      diffs.push_back(
          detail::concat(key, " ", a ? "true" : "false", " (checkpoint) vs ", b ? "true" : "false", " (model)"));
  };
  compare("vocab_size", saved.vocab_size, model.vocab_size);
  compare("block_size", saved.block_size, model.block_size);
  compare("n_layer", saved.n_layer, model.n_layer);
  compare("n_head", saved.n_head, model.n_head);
  compare("n_embd", saved.n_embd, model.n_embd);
  compare_flag("bias", saved.bias, model.bias);
  compare_flag("tie_embeddings", saved.tie_embeddings, model.tie_embeddings);
  PRECIS_CHECK(diffs.empty(), "checkpoint '", source,
               "': the checkpoint was made for a different model configuration: ", join(diffs),
               "; build the model with the checkpoint's configuration");
}

}  // namespace

std::vector<nn::NamedTensor> hf_state_dict(models::GPT2& model) {
  NoGradGuard no_grad;
  const int64_t vocab_size = model.config().vocab_size;
  std::vector<nn::NamedTensor> out;
  for (const auto& [name, param] : model.named_parameters()) {
    Tensor t = param.detach();
    if (is_vocab_padded(name)) {
      t = t.slice(0, 0, vocab_size);
    } else if (is_conv1d_weight(name)) {
      // Transposed on the host, where the file's bytes go anyway (parameters are dense, so
      // moving one off the GPU is a plain copy).
      t = t.to(Device::cpu()).t().contiguous();
    }
    out.push_back({name, t});
  }
  return out;
}

void load_hf_state_dict(models::GPT2& model, const std::vector<nn::NamedTensor>& tensors) {
  const models::GPT2Config& config = model.config();
  std::map<std::string, Tensor> given;
  std::map<std::string, std::string> original_name;
  for (const auto& [name, t] : tensors) {
    std::string key = hf_key(name);
    if (is_hf_mask_buffer(key)) continue;
    PRECIS_CHECK(!given.count(key), "load_hf_state_dict: tensor '", key, "' is given twice (as '", original_name[key],
                 "' and '", name, "')");
    given[key] = t;
    original_name[key] = name;
  }

  auto wte = given.find("transformer.wte.weight");
  const Tensor wte_given = wte != given.end() ? wte->second : Tensor();

  struct Copy {
    Tensor dst, src;
  };
  std::vector<Copy> copies;
  std::vector<Tensor> padding;
  std::vector<std::string> mismatched, missing, bad_dtype;
  for (const auto& [name, param] : model.named_parameters()) {
    auto it = given.find(name);
    if (it == given.end()) {
      missing.push_back(name);
      continue;
    }
    const Tensor& src = it->second;
    Shape expected = hf_shape(name, param, config.vocab_size);
    if (src.shape() != expected) {
      mismatched.push_back(
          detail::concat(name, " is ", src.shape(), " in the checkpoint but ", expected, " in the model"));
    } else if (!is_floating(src.dtype())) {
      bad_dtype.push_back(detail::concat(name, " (", dtype_name(src.dtype()), ")"));
    } else if (is_vocab_padded(name)) {
      copies.push_back({param.detach().slice(0, 0, config.vocab_size), src});
      if (param.size(0) > config.vocab_size)
        padding.push_back(param.detach().slice(0, config.vocab_size, param.size(0)));
    } else {
      copies.push_back({param.detach(), is_conv1d_weight(name) ? src.detach().t() : src});
    }
    given.erase(it);
  }
  // HF files of tied models may still carry lm_head.weight; it must then be wte itself.
  if (auto head = given.find("lm_head.weight"); config.tie_embeddings && head != given.end() && wte_given.defined()) {
    PRECIS_CHECK(
        same_bytes(head->second, wte_given), "load_hf_state_dict: the checkpoint has an lm_head.weight ",
        "different from transformer.wte.weight, but this model ties them; build it with tie_embeddings: false");
    given.erase(head);
  }
  std::vector<std::string> unexpected;  // in the checkpoint's order
  for (const auto& [name, t] : tensors)
    if (given.count(hf_key(name)) && original_name[hf_key(name)] == name) unexpected.push_back(name);

  if (!mismatched.empty() || !missing.empty() || !unexpected.empty()) {
    std::string message = "load_hf_state_dict: the checkpoint was made for a different model configuration:";
    if (!mismatched.empty()) message += " " + join(mismatched) + ";";
    if (!missing.empty()) message += " missing from the checkpoint: " + join(missing) + ";";
    if (!unexpected.empty()) message += " not in the model: " + join(unexpected) + ";";
    PRECIS_FAIL(message, " the model is ", describe_config(config));
  }
  PRECIS_CHECK(bad_dtype.empty(), "load_hf_state_dict: weights must be floating point, got ", join(bad_dtype));

  NoGradGuard no_grad;
  for (const Copy& c : copies) {
    if (c.dst.is_cpu()) {
      copy_(c.dst, c.src);
    } else {
      // Convert on the host, then one contiguous host-to-device copy.
      Tensor staged = empty(c.dst.shape(), c.dst.dtype());
      copy_(staged, c.src);
      copy_(c.dst, staged);
    }
  }
  for (const Tensor& rows : padding) fill_(rows, 0.0);
}

std::string checkpoint_step_name(int64_t step) {
  PRECIS_CHECK(step >= 0, "checkpoint: the step must be non-negative, got ", step);
  char name[32];
  std::snprintf(name, sizeof(name), "step_%08lld", static_cast<long long>(step));
  return name;
}

CheckpointModel gpt2_checkpoint_model(models::GPT2& model) {
  CheckpointModel m;
  m.tensors = [&model] { return hf_state_dict(model); };
  m.config = [&model] { return model.config().to_json(); };
  m.load = [&model](const std::vector<nn::NamedTensor>& tensors) { load_hf_state_dict(model, tensors); };
  m.check_config = [&model](const Json& saved, const std::string& source) {
    check_config(source, models::GPT2Config::from_json(saved, config_path_for(source).string()), model.config());
  };
  return m;
}

CheckpointModel module_checkpoint_model(nn::Module& model, Json config) {
  CheckpointModel m;
  m.tensors = [&model] {
    std::vector<nn::NamedTensor> tensors;
    for (const auto& [name, tensor] : model.state_dict()) tensors.push_back({name, tensor});
    return tensors;
  };
  m.config = [config] { return config; };
  m.load = [&model](const std::vector<nn::NamedTensor>& tensors) {
    std::map<std::string, Tensor> state;
    for (const auto& [name, tensor] : tensors) state[name] = tensor;
    model.load_state_dict(state);
  };
  return m;
}

std::string save_checkpoint(const std::string& dir, int64_t step, models::GPT2& model,
                            const optim::Optimizer* optimizer, const Json& train_state, int64_t keep_last) {
  return save_checkpoint(dir, step, gpt2_checkpoint_model(model),
                         optimizer ? optimizer->state_dict() : std::map<std::string, Tensor>(), train_state, keep_last);
}

std::string save_checkpoint(const std::string& dir, int64_t step, models::GPT2& model,
                            const std::map<std::string, Tensor>& optimizer_state, const Json& train_state,
                            int64_t keep_last) {
  return save_checkpoint(dir, step, gpt2_checkpoint_model(model), optimizer_state, train_state, keep_last);
}

std::string save_checkpoint(const std::string& dir, int64_t step, const CheckpointModel& model,
                            const optim::Optimizer* optimizer, const Json& train_state, int64_t keep_last) {
  return save_checkpoint(dir, step, model, optimizer ? optimizer->state_dict() : std::map<std::string, Tensor>(),
                         train_state, keep_last);
}

std::string save_checkpoint(const std::string& dir, int64_t step, const CheckpointModel& model,
                            const std::map<std::string, Tensor>& optimizer_state, const Json& train_state,
                            int64_t keep_last) {
  const std::vector<nn::NamedTensor> weights = model.tensors();
  std::vector<nn::NamedTensor> state;
  for (const auto& [key, value] : optimizer_state) state.push_back({kOptimizerPrefix + key, value});
  check_finite_before_saving(dir, step, weights, state);

  const std::string name = checkpoint_step_name(step);
  const fs::path root(dir), target = root / name, tmp = root / (name + ".tmp");
  std::error_code ec;
  fs::create_directories(root, ec);
  PRECIS_CHECK(!ec, "checkpoint: cannot create the directory '", dir, "': ", ec.message());
  fs::remove_all(tmp, ec);
  fs::create_directory(tmp, ec);
  PRECIS_CHECK(!ec, "checkpoint: cannot create '", tmp.string(), "': ", ec.message());

  write_safetensors((tmp / kModelFile).string(), weights, {{"format", "pt"}});
  write_safetensors((tmp / kTrainStateFile).string(), state, {{"train_state", train_state.dump()}});
  write_text_file(tmp / kConfigFile, model.config().dump() + "\n");
  fsync_directory(tmp);

  install_directory(tmp, target);
  fsync_directory(root);
  write_text_file(root / kLatestFile, name + "\n");
  prune_checkpoints(root, step, keep_last);
  return target.string();
}

bool has_checkpoint(const std::string& dir) {
  std::error_code ec;
  return fs::is_regular_file(fs::path(dir) / kLatestFile, ec);
}

std::string resolve_checkpoint(const std::string& path_or_dir) {
  const fs::path path(path_or_dir);
  std::error_code ec;
  PRECIS_CHECK(fs::exists(path, ec), "no checkpoint in '", path_or_dir, "': the path does not exist");
  if (!fs::is_directory(path, ec)) return path_or_dir;
  if (fs::exists(path / kLatestFile, ec)) {
    std::string name = read_text_file(path / kLatestFile);
    while (!name.empty() && std::isspace(static_cast<unsigned char>(name.back()))) name.pop_back();
    PRECIS_CHECK(parse_step_name(name) >= 0, "checkpoint '", path_or_dir, "': the 'latest' file should name a ",
                 "step_XXXXXXXX folder but holds '", name, "'");
    PRECIS_CHECK(fs::is_directory(path / name, ec), "checkpoint '", path_or_dir, "': 'latest' names '", name,
                 "' but that folder does not exist");
    return (path / name).string();
  }
  PRECIS_CHECK(fs::exists(path / kModelFile, ec), "no checkpoint in '", path_or_dir, "': it holds neither a '",
               kLatestFile, "' file nor ", kModelFile,
               " (give the checkpoint directory of a training run, or one of its step_XXXXXXXX folders)");
  return path_or_dir;
}

std::optional<models::GPT2Config> checkpoint_model_config(const std::string& path_or_dir) {
  const fs::path config = config_path_for(resolve_checkpoint(path_or_dir));
  std::error_code ec;
  if (!fs::exists(config, ec)) return std::nullopt;
  const Json json = read_json_file(config.string());
  // An image classifier's checkpoint (train/image_task.cpp writes {"model": "resnet18", ...}).
  PRECIS_CHECK(!(json.is_object() && json.contains("model") && json.contains("num_classes")), "checkpoint '",
               path_or_dir, "' holds an image classifier (", json.dump(),
               "), not a GPT-2; its model.safetensors is a PyTorch state_dict (torchvision's names for a ResNet), "
               "and `precis train` resumes it with checkpoint.resume=true");
  return models::GPT2Config::from_json(json, config.string());
}

Json read_train_state(const std::string& path_or_dir) {
  const fs::path state_file = fs::path(resolve_checkpoint(path_or_dir)) / kTrainStateFile;
  std::error_code ec;
  if (!fs::is_regular_file(state_file, ec)) return Json::object();
  const SafetensorsMetadata metadata = read_safetensors_metadata(state_file.string());
  auto it = metadata.find("train_state");
  return it == metadata.end() ? Json::object()
                              : Json::parse(it->second, state_file.string() + " (train_state metadata)");
}

Json load_checkpoint(const std::string& path_or_dir, models::GPT2& model, optim::Optimizer* optimizer) {
  OptimizerStateLoader load_optimizer;
  if (optimizer)
    load_optimizer = [optimizer](const std::map<std::string, Tensor>& state) { optimizer->load_state_dict(state); };
  return load_checkpoint_into(path_or_dir, gpt2_checkpoint_model(model), load_optimizer);
}

Json load_checkpoint_into(const std::string& path_or_dir, models::GPT2& model,
                          const OptimizerStateLoader& load_optimizer) {
  return load_checkpoint_into(path_or_dir, gpt2_checkpoint_model(model), load_optimizer);
}

Json load_checkpoint(const std::string& path_or_dir, const CheckpointModel& model, optim::Optimizer* optimizer) {
  OptimizerStateLoader load_optimizer;
  if (optimizer)
    load_optimizer = [optimizer](const std::map<std::string, Tensor>& state) { optimizer->load_state_dict(state); };
  return load_checkpoint_into(path_or_dir, model, load_optimizer);
}

Json load_checkpoint_into(const std::string& path_or_dir, const CheckpointModel& model,
                          const OptimizerStateLoader& load_optimizer) {
  const bool optimizer = static_cast<bool>(load_optimizer);
  const std::string target = resolve_checkpoint(path_or_dir);
  std::error_code ec;
  const fs::path config = config_path_for(target);
  if (model.check_config && fs::exists(config, ec)) model.check_config(read_json_file(config.string()), target);
  if (!fs::is_directory(target, ec)) {
    PRECIS_CHECK(!optimizer, "checkpoint '", target, "' is a bare weights file: it has no optimizer state to ",
                 "resume from (give a step folder written by training)");
    load_weights_file(target, model);
    return Json::object();
  }

  const fs::path folder(target);
  const std::string model_file = (folder / kModelFile).string(), state_file = (folder / kTrainStateFile).string();
  PRECIS_CHECK(fs::exists(model_file, ec), "checkpoint '", target, "' is incomplete: ", kModelFile, " is missing");
  const bool has_state = fs::exists(state_file, ec);
  PRECIS_CHECK(has_state || !optimizer, "checkpoint '", target, "' is incomplete: ", kTrainStateFile,
               " is missing, so the optimizer cannot be resumed");

  // Read and check everything before changing the model.
  SafetensorsMetadata metadata;
  std::map<std::string, Tensor> optimizer_state;
  if (optimizer) {
    SafetensorsFile state = read_safetensors(state_file);
    check_finite_after_loading(state_file, state.tensors);
    metadata = std::move(state.metadata);
    for (auto& [key, value] : state.tensors) {
      PRECIS_CHECK(key.starts_with(kOptimizerPrefix), "checkpoint '", state_file, "': unexpected tensor '", key, "'");
      optimizer_state[key.substr(std::strlen(kOptimizerPrefix))] = value;
    }
    PRECIS_CHECK(!optimizer_state.empty(), "checkpoint '", target, "' was saved without optimizer state; ",
                 "it can seed the weights but not resume the optimizer");
  } else if (has_state) {
    metadata = read_safetensors_metadata(state_file);
  }
  Json train_state = Json::object();
  if (has_state) {
    auto it = metadata.find("train_state");
    PRECIS_CHECK(it != metadata.end(), "checkpoint '", state_file, "': no \"train_state\" in its metadata");
    train_state = Json::parse(it->second, state_file + " (train_state metadata)");
  }

  load_weights_file(model_file, model);
  if (optimizer) {
    try {
      load_optimizer(optimizer_state);
    } catch (const Error& e) {
      PRECIS_FAIL("checkpoint '", state_file, "': ", e.what());
    }
  }
  return train_state;
}

}  // namespace precis::train
