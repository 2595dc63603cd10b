#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/autograd.h"
#include "core/copy.h"
#include "core/random.h"
#include "optim/adamw.h"
#include "support/errors.h"
#include "train/checkpoint.h"
#include "train/safetensors.h"

using namespace precis;
using namespace precis::train;
using precis::models::GPT2;
using precis::models::GPT2Config;
using precis::testing::error_of;
namespace fs = std::filesystem;

namespace {

#define EXPECT_CONTAINS(text, part) \
  EXPECT_NE(std::string(text).find(part), std::string::npos) << "'" << (part) << "' not in: " << (text)

fs::path scratch_dir(const std::string& name) {
  fs::path dir = fs::temp_directory_path() / ("precis_test_checkpoint_" + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

// vocab 67 pads to 128 rows: the padding is real.
GPT2Config tiny_config(bool tied = true) {
  GPT2Config c;
  c.vocab_size = 67;
  c.block_size = 16;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 8;
  c.tie_embeddings = tied;
  return c;
}

Tensor tokens(uint64_t seed) {
  Generator gen(seed);
  return randint(0, 67, {2, 11}, DType::i64, &gen);
}

std::vector<float> logits_of(GPT2& model, const Tensor& idx) {
  NoGradGuard no_grad;
  return model.forward(idx).logits.to_vector<float>();
}

std::vector<float> values(const Tensor& t) { return t.to_vector<float>(); }

const Tensor& find(const std::vector<nn::NamedTensor>& tensors, const std::string& name) {
  for (const auto& t : tensors)
    if (t.name == name) return t.tensor;
  throw Error("no tensor named " + name);
}

std::string read_text(const fs::path& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// Gives every parameter a gradient and takes an optimizer step, so the state is not all zeros.
// The padded embedding rows get none, as in training (their logits are cut off).
void take_step(optim::Optimizer& optimizer, GPT2& model, uint64_t seed) {
  Generator gen(seed);
  for (Tensor p : model.parameters()) p.set_grad(randn(p.shape(), p.dtype(), &gen));
  fill_(model.wte().grad().slice(0, model.config().vocab_size, model.config().padded_vocab_size()), 0.0);
  optimizer.step();
}

}  // namespace

TEST(HFStateDict, UsesHuggingFaceNamesAndLayouts) {
  GPT2 model(tiny_config(), 5);
  std::vector<nn::NamedTensor> hf = hf_state_dict(model);
  std::map<std::string, Tensor> params = model.state_dict();
  ASSERT_EQ(hf.size(), model.named_parameters().size());
  EXPECT_EQ(hf.front().name, "transformer.wte.weight");
  EXPECT_EQ(hf.back().name, "transformer.ln_f.bias");

  EXPECT_EQ(find(hf, "transformer.wte.weight").shape(), Shape({67, 8}));
  EXPECT_EQ(values(find(hf, "transformer.wte.weight")), values(model.wte().slice(0, 0, 67)));
  EXPECT_EQ(find(hf, "transformer.wpe.weight").shape(), Shape({16, 8}));
  const std::pair<const char*, Shape> conv1d[] = {{"transformer.h.1.attn.c_attn.weight", {8, 24}},
                                                  {"transformer.h.1.attn.c_proj.weight", {8, 8}},
                                                  {"transformer.h.0.mlp.c_fc.weight", {8, 32}},
                                                  {"transformer.h.0.mlp.c_proj.weight", {32, 8}}};
  for (const auto& [name, shape] : conv1d) {
    SCOPED_TRACE(name);
    const Tensor& t = find(hf, name);
    EXPECT_EQ(t.shape(), shape);
    EXPECT_EQ(values(t), values(params.at(name).t()));
  }
  EXPECT_EQ(find(hf, "transformer.h.1.attn.c_attn.bias").shape(), Shape({24}));
  EXPECT_EQ(find(hf, "transformer.h.0.ln_2.weight").shape(), Shape({8}));
  for (const auto& t : hf) EXPECT_NE(t.name, "lm_head.weight") << "tied embeddings have no separate head";

  GPT2 untied(tiny_config(false), 5);
  std::vector<nn::NamedTensor> hf_untied = hf_state_dict(untied);
  EXPECT_EQ(find(hf_untied, "lm_head.weight").shape(), Shape({67, 8}));
  EXPECT_EQ(values(find(hf_untied, "lm_head.weight")), values(untied.lm_head_weight().slice(0, 0, 67)));
}

TEST(HFStateDict, LoadIsTheInverseAndZeroesPadding) {
  for (bool tied : {true, false}) {
    SCOPED_TRACE(tied ? "tied" : "untied");
    GPT2 source(tiny_config(tied), 1), target(tiny_config(tied), 2);
    fill_(target.wte().slice(0, 67, 128), 9.0);  // padding must not survive a load
    if (!tied) fill_(target.lm_head_weight().slice(0, 67, 128), 9.0);
    load_hf_state_dict(target, hf_state_dict(source));
    std::map<std::string, Tensor> a = source.state_dict(), b = target.state_dict();
    ASSERT_EQ(a.size(), b.size());
    for (const auto& [name, t] : a) EXPECT_EQ(values(t), values(b.at(name))) << name;
    EXPECT_EQ(values(target.wte().slice(0, 67, 128)), std::vector<float>(61 * 8, 0.0f));
  }
}

TEST(HFStateDict, ConvertsDTypesAndAcceptsHuggingFaceFileNames) {
  GPT2 source(tiny_config(), 1), target(tiny_config(), 2);
  // As transformers' GPT2Model files: no "transformer." prefix, f64 values, causal-mask buffers,
  // and an lm_head.weight that is the tied wte.
  std::vector<nn::NamedTensor> hf;
  for (const auto& [name, t] : hf_state_dict(source))
    hf.push_back({name.substr(std::strlen("transformer.")), t.to(DType::f64)});
  hf.push_back({"h.0.attn.bias", ones({1, 1, 16, 16})});
  hf.push_back({"h.1.attn.masked_bias", scalar_tensor(-1e4)});
  hf.push_back({"lm_head.weight", find(hf, "wte.weight")});
  load_hf_state_dict(target, hf);
  EXPECT_EQ(target.wte().dtype(), DType::f32);
  std::map<std::string, Tensor> a = source.state_dict(), b = target.state_dict();
  for (const auto& [name, t] : a) EXPECT_EQ(values(t), values(b.at(name))) << name;

  hf.back().tensor = zeros({67, 8}, DType::f64);
  EXPECT_CONTAINS(error_of([&] { load_hf_state_dict(target, hf); }),
                  "lm_head.weight different from transformer.wte.weight, but this model ties them");
}

TEST(HFStateDict, MismatchedConfigurationNamesTensorsAndShapes) {
  GPT2 source(tiny_config(), 1);
  GPT2Config wider = tiny_config();
  wider.n_embd = 16;
  GPT2 wide(wider, 1);
  std::string message = error_of([&] { load_hf_state_dict(wide, hf_state_dict(source)); });
  EXPECT_CONTAINS(message, "the checkpoint was made for a different model configuration");
  EXPECT_CONTAINS(message, "transformer.wte.weight is [67, 8] in the checkpoint but [67, 16] in the model");
  EXPECT_CONTAINS(message, "n_embd=16");

  GPT2Config deeper = tiny_config();
  deeper.n_layer = 3;
  GPT2 deep(deeper, 1);
  message = error_of([&] { load_hf_state_dict(deep, hf_state_dict(source)); });
  EXPECT_CONTAINS(message, "missing from the checkpoint: transformer.h.2.ln_1.weight, transformer.h.2.ln_1.bias");

  GPT2Config shallower = tiny_config();
  shallower.n_layer = 1;
  GPT2 shallow(shallower, 3);
  std::vector<float> before = values(shallow.wpe());
  message = error_of([&] { load_hf_state_dict(shallow, hf_state_dict(source)); });
  EXPECT_CONTAINS(message, "not in the model: transformer.h.1.ln_1.weight");
  EXPECT_EQ(values(shallow.wpe()), before) << "a failed load must not change the model";

  GPT2 untied(tiny_config(false), 1);
  message = error_of([&] { load_hf_state_dict(untied, hf_state_dict(source)); });
  EXPECT_CONTAINS(message, "missing from the checkpoint: lm_head.weight");
}

TEST(Checkpoint, RoundTripGivesIdenticalLogits) {
  fs::path dir = scratch_dir("round_trip");
  GPT2 source(tiny_config(), 1), target(tiny_config(), 2);
  Tensor idx = tokens(4);
  ASSERT_NE(logits_of(source, idx), logits_of(target, idx));
  std::string folder = save_checkpoint(dir.string(), 7, source, nullptr, Json::object(), 2);
  EXPECT_EQ(folder, (dir / "step_00000007").string());
  EXPECT_TRUE(has_checkpoint(dir.string()));
  Json state = load_checkpoint(dir.string(), target);
  EXPECT_EQ(state, Json::object());
  EXPECT_EQ(logits_of(source, idx), logits_of(target, idx));
}

TEST(Checkpoint, FilesHoldTheHuggingFaceLayout) {
  fs::path dir = scratch_dir("layout");
  GPT2 model(tiny_config(), 1);
  std::string folder = save_checkpoint(dir.string(), 3, model, nullptr, Json::object(), 2);
  SafetensorsFile weights = read_safetensors(folder + "/model.safetensors");
  EXPECT_EQ(weights.metadata.at("format"), "pt");
  std::vector<nn::NamedTensor> expected = hf_state_dict(model);
  ASSERT_EQ(weights.tensors.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(weights.tensors[i].name, expected[i].name);
    EXPECT_EQ(weights.tensors[i].tensor.shape(), expected[i].tensor.shape()) << expected[i].name;
    EXPECT_EQ(values(weights.tensors[i].tensor), values(expected[i].tensor)) << expected[i].name;
  }
  EXPECT_EQ(find(weights.tensors, "transformer.wte.weight").shape(), Shape({67, 8}));
  EXPECT_EQ(find(weights.tensors, "transformer.h.0.attn.c_attn.weight").shape(), Shape({8, 24}));
  EXPECT_EQ(find(weights.tensors, "transformer.h.0.mlp.c_fc.weight").shape(), Shape({8, 32}));
  EXPECT_EQ(find(weights.tensors, "transformer.h.0.mlp.c_proj.weight").shape(), Shape({32, 8}));

  Json config = read_json_file(folder + "/config.json");
  EXPECT_EQ(config.at("model_type").as_string(), "gpt2");
  EXPECT_EQ(config.at("n_positions").as_int(), 16);
  EXPECT_EQ(config.at("activation_function").as_string(), "gelu_new");
  std::optional<GPT2Config> read_back = checkpoint_model_config(dir.string());
  ASSERT_TRUE(read_back.has_value());
  EXPECT_EQ(read_back->vocab_size, 67);
  EXPECT_EQ(read_back->block_size, 16);
  EXPECT_EQ(read_back->n_layer, 2);
  EXPECT_EQ(read_back->n_head, 2);
  EXPECT_EQ(read_back->n_embd, 8);
  EXPECT_TRUE(read_back->tie_embeddings);
  EXPECT_TRUE(read_back->bias);
}

TEST(Checkpoint, OptimizerAndTrainStateRoundTrip) {
  fs::path dir = scratch_dir("optimizer");
  GPT2 model(tiny_config(), 1);
  optim::AdamW optimizer(optim::default_param_groups(model, 0.1), {.lr = 1e-2});
  take_step(optimizer, model, 10);
  take_step(optimizer, model, 11);
  Json train_state = Json::object();
  train_state["step"] = 2;
  train_state["rng"]["seed"] = int64_t(1337);
  train_state["rng"]["offset"] = int64_t(123456789012345);
  train_state["data"]["position"] = 4096;
  train_state["loss"] = 3.25;
  save_checkpoint(dir.string(), 2, model, &optimizer, train_state, 2);
  const std::vector<float> saved_wte = values(model.wte());

  GPT2 resumed(tiny_config(), 99);
  optim::AdamW resumed_optimizer(optim::default_param_groups(resumed, 0.1), {.lr = 1e-2});
  Json loaded = load_checkpoint(dir.string(), resumed, &resumed_optimizer);
  EXPECT_EQ(loaded, train_state);
  EXPECT_EQ(loaded.at("rng").at("offset").as_int(), 123456789012345);
  EXPECT_EQ(resumed_optimizer.step_count(), 2);
  std::map<std::string, Tensor> a = optimizer.state_dict(), b = resumed_optimizer.state_dict();
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [key, t] : a) {
    ASSERT_TRUE(b.count(key)) << key;
    EXPECT_EQ(t.dtype(), b.at(key).dtype()) << key;
    EXPECT_EQ(t.to_vector<double>(), b.at(key).to_vector<double>()) << key;
  }
  // The next step is the same in both.
  take_step(optimizer, model, 12);
  take_step(resumed_optimizer, resumed, 12);
  std::map<std::string, Tensor> pa = model.state_dict(), pb = resumed.state_dict();
  for (const auto& [name, t] : pa) EXPECT_EQ(values(t), values(pb.at(name))) << name;

  // Weights only (the sampler) needs no optimizer and still returns the train state.
  GPT2 weights_only(tiny_config(), 5);
  EXPECT_EQ(load_checkpoint(dir.string(), weights_only), train_state);
  EXPECT_EQ(values(weights_only.wte()), saved_wte);
}

TEST(Checkpoint, ResumingAnOptimizerFromAWeightsOnlyCheckpointIsAnError) {
  fs::path dir = scratch_dir("no_optimizer");
  GPT2 model(tiny_config(), 1);
  save_checkpoint(dir.string(), 1, model, nullptr, Json::object(), 2);
  optim::AdamW optimizer(optim::default_param_groups(model, 0.1));
  EXPECT_CONTAINS(error_of([&] { load_checkpoint(dir.string(), model, &optimizer); }),
                  "was saved without optimizer state");
}

TEST(Checkpoint, LatestPointerAndKeepLast) {
  fs::path dir = scratch_dir("keep_last");
  GPT2 model(tiny_config(), 1);
  for (int64_t step : {10, 20, 30, 40}) {
    Json state = Json::object();
    state["step"] = step;
    save_checkpoint(dir.string(), step, model, nullptr, state, 2);
    EXPECT_EQ(read_text(dir / "latest"), checkpoint_step_name(step) + "\n");
  }
  std::vector<std::string> entries;
  for (const auto& e : fs::directory_iterator(dir)) entries.push_back(e.path().filename().string());
  std::sort(entries.begin(), entries.end());
  EXPECT_EQ(entries, (std::vector<std::string>{"latest", "step_00000030", "step_00000040"}));
  EXPECT_EQ(resolve_checkpoint(dir.string()), (dir / "step_00000040").string());
  EXPECT_EQ(load_checkpoint(dir.string(), model).at("step").as_int(), 40);
  // A step folder loads directly.
  EXPECT_EQ(load_checkpoint((dir / "step_00000030").string(), model).at("step").as_int(), 30);

  // keep_last <= 0 keeps everything.
  fs::path all = scratch_dir("keep_all");
  for (int64_t step : {1, 2, 3}) save_checkpoint(all.string(), step, model, nullptr, Json::object(), 0);
  int folders = 0;
  for (const auto& e : fs::directory_iterator(all)) folders += e.is_directory();
  EXPECT_EQ(folders, 3);
}

TEST(Checkpoint, ACrashedSaveLeavesThePreviousCheckpointUsable) {
  fs::path dir = scratch_dir("crash");
  GPT2 model(tiny_config(), 1), other(tiny_config(), 2);
  Json state = Json::object();
  state["step"] = 5;
  save_checkpoint(dir.string(), 5, model, nullptr, state, 3);
  // A save of step 6 that died half way: its folder is still the .tmp one, with a partial file.
  fs::create_directories(dir / "step_00000006.tmp");
  std::ofstream(dir / "step_00000006.tmp" / "model.safetensors") << "partial";
  std::ofstream(dir / "latest.tmp") << "step_000";
  Tensor idx = tokens(1);
  EXPECT_EQ(load_checkpoint(dir.string(), other).at("step").as_int(), 5);
  EXPECT_EQ(logits_of(other, idx), logits_of(model, idx));

  // The next save cleans up after it.
  save_checkpoint(dir.string(), 6, model, nullptr, state, 3);
  EXPECT_FALSE(fs::exists(dir / "step_00000006.tmp"));
  EXPECT_TRUE(fs::exists(dir / "step_00000006" / "model.safetensors"));

  // Saving the same step again replaces it whole.
  state["step"] = 66;
  save_checkpoint(dir.string(), 6, model, nullptr, state, 3);
  EXPECT_EQ(load_checkpoint(dir.string(), other).at("step").as_int(), 66);
  EXPECT_FALSE(fs::exists(dir / "step_00000006.tmp"));
}

TEST(Checkpoint, MismatchedConfigurationIsAClearError) {
  fs::path dir = scratch_dir("mismatch");
  GPT2 model(tiny_config(), 1);
  std::string folder = save_checkpoint(dir.string(), 1, model, nullptr, Json::object(), 2);

  GPT2Config heads = tiny_config();
  heads.n_head = 4;  // same shapes: only config.json tells
  GPT2 other_heads(heads, 1);
  std::string message = error_of([&] { load_checkpoint(dir.string(), other_heads); });
  EXPECT_CONTAINS(message, folder);
  EXPECT_CONTAINS(message,
                  "the checkpoint was made for a different model configuration: n_head 2 (checkpoint) vs 4 (model)");

  // Without config.json (as a bare file from elsewhere), the shapes tell.
  fs::remove(fs::path(folder) / "config.json");
  GPT2Config wider = tiny_config();
  wider.n_embd = 16;
  GPT2 wide(wider, 1);
  message = error_of([&] { load_checkpoint(dir.string(), wide); });
  EXPECT_CONTAINS(message, folder + "/model.safetensors");
  EXPECT_CONTAINS(message, "different model configuration");
  EXPECT_CONTAINS(message, "transformer.h.0.attn.c_attn.weight is [8, 24] in the checkpoint but [16, 48] in the model");
  EXPECT_FALSE(checkpoint_model_config(dir.string()).has_value());
}

TEST(Checkpoint, MissingOrCorruptCheckpointsAreClearErrors) {
  fs::path dir = scratch_dir("missing");
  GPT2 model(tiny_config(), 1);
  std::string nowhere = (dir / "nowhere").string();
  EXPECT_CONTAINS(error_of([&] { load_checkpoint(nowhere, model); }),
                  "no checkpoint in '" + nowhere + "': the path does not exist");
  EXPECT_FALSE(has_checkpoint(nowhere));
  EXPECT_FALSE(has_checkpoint(dir.string()));
  EXPECT_CONTAINS(error_of([&] { load_checkpoint(dir.string(), model); }),
                  "no checkpoint in '" + dir.string() + "': it holds neither a 'latest' file nor model.safetensors");

  std::ofstream(dir / "latest") << "step_00000009\n";
  EXPECT_CONTAINS(error_of([&] { load_checkpoint(dir.string(), model); }),
                  "'latest' names 'step_00000009' but that folder does not exist");

  fs::remove(dir / "latest");
  std::string folder = save_checkpoint(dir.string(), 9, model, nullptr, Json::object(), 2);
  fs::path weights = fs::path(folder) / "model.safetensors";
  fs::resize_file(weights, fs::file_size(weights) - 10);
  std::string message = error_of([&] { load_checkpoint(dir.string(), model); });
  EXPECT_CONTAINS(message, weights.string());
  EXPECT_CONTAINS(message, "truncated");

  fs::remove(weights);
  EXPECT_CONTAINS(error_of([&] { load_checkpoint(folder, model); }), "no checkpoint in");
}

TEST(Checkpoint, LoadsABareWeightsFile) {
  fs::path dir = scratch_dir("bare");
  GPT2 source(tiny_config(), 1), target(tiny_config(), 2);
  std::string file = (dir / "gpt2.safetensors").string();
  write_safetensors(file, hf_state_dict(source), {{"format", "pt"}});
  EXPECT_EQ(load_checkpoint(file, target), Json::object());
  Tensor idx = tokens(2);
  EXPECT_EQ(logits_of(source, idx), logits_of(target, idx));
  optim::AdamW optimizer(optim::default_param_groups(target, 0.1));
  EXPECT_CONTAINS(error_of([&] { load_checkpoint(file, target, &optimizer); }), "is a bare weights file");
}
