#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>

#include "core/autograd.h"
#include "core/copy.h"
#include "core/source_dir.h"
#include "models/gpt2.h"
#include "ops/ops.h"
#include "support/gradcheck.h"
#include "train/checkpoint.h"
#include "train/safetensors.h"

using namespace precis;
using precis::models::GPT2;
using precis::models::GPT2Config;
using precis::models::GPT2Output;
namespace fs = std::filesystem;

namespace {

// The fixture of tests/fixtures/README.md: vocab 67 (padded to 128), seed 7, float64.
const fs::path kFixtureDir = fs::path(PRECIS_SOURCE_DIR) / "tests" / "fixtures" / "gpt2_tiny";
constexpr uint64_t kFixtureSeed = 7;
constexpr double kFixtureScale = 0.5;

GPT2Config tiny_config(bool tied = true) {
  GPT2Config c;
  c.vocab_size = 67;
  c.block_size = 16;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 8;
  c.bias = true;
  c.tie_embeddings = tied;
  return c;
}

// Rebinds every parameter to a copy converted to `dtype` (GPT2 is built in f32).
void convert_parameters(nn::Module& model, DType dtype) {
  NoGradGuard no_grad;
  for (const auto& [name, p] : model.named_parameters()) {
    Tensor converted = p.detach().to(dtype).contiguous();
    TensorImpl* impl = p.impl();
    impl->storage = converted.storage();
    impl->dtype = dtype;
    impl->strides = converted.strides();
    impl->offset = converted.offset();
  }
}

// Replaces GPT-2's small initial weights by larger random ones (LayerNorm gains near 1), so the
// checks below run where the nonlinearities bend; padded vocabulary rows stay zero.
void randomize(GPT2& model, uint64_t seed, double scale) {
  NoGradGuard no_grad;
  uint64_t i = 0;
  for (const auto& [name, p] : model.named_parameters()) {
    bool gain = name.find(".ln_") != std::string::npos && name.ends_with(".weight");
    copy_(p,
          precis::testing::random_f64(p.shape(), seed + i++, gain ? 1.0 - scale : -scale, gain ? 1.0 + scale : scale));
  }
  const GPT2Config& c = model.config();
  fill_(model.wte().slice(0, c.vocab_size, c.padded_vocab_size()), 0.0);
  if (!c.tie_embeddings) fill_(model.lm_head_weight().slice(0, c.vocab_size, c.padded_vocab_size()), 0.0);
}

Tensor random_tokens(const Shape& shape, uint64_t seed, int64_t vocab = 67) {
  Generator gen(seed);
  return randint(0, vocab, shape, DType::i64, &gen);
}

Tensor parameter(GPT2& model, const std::string& name) {
  for (const auto& p : model.named_parameters())
    if (p.name == name) return p.tensor;
  throw Error("no parameter " + name);
}

// The fixture model: GPT2(tiny_config(), 7) in float64 with randomize(model, 7, 0.5), so that
// biases are non-zero, LayerNorm gains differ from 1 and the nonlinearities bend.
void make_fixture_model(GPT2& model) {
  convert_parameters(model, DType::f64);
  randomize(model, kFixtureSeed, kFixtureScale);
}

}  // namespace

// The committed weights are exactly hf_state_dict of the fixture model.
// With PRECIS_WRITE_FIXTURES=1 this test first (re)writes them and config.json.
TEST(GPT2Fixture, WeightsFileIsTheSeededTinyModel) {
  GPT2 model(tiny_config(), kFixtureSeed);
  make_fixture_model(model);
  std::vector<nn::NamedTensor> expected = train::hf_state_dict(model);
  const std::string weights_path = (kFixtureDir / "model.safetensors").string();
  const std::string config_path = (kFixtureDir / "config.json").string();
  if (const char* write = std::getenv("PRECIS_WRITE_FIXTURES"); write && std::string(write) == "1") {
    fs::create_directories(kFixtureDir);
    train::write_safetensors(weights_path, expected, {{"format", "pt"}});
    std::ofstream(config_path) << model.config().to_json().dump() << "\n";
  }
  const char* stale = "; if the change is intended, regenerate the fixture as tests/fixtures/README.md says";
  train::SafetensorsFile file = train::read_safetensors(weights_path);
  ASSERT_EQ(file.tensors.size(), expected.size()) << stale;
  for (size_t i = 0; i < expected.size(); ++i) {
    SCOPED_TRACE(expected[i].name);
    EXPECT_EQ(file.tensors[i].name, expected[i].name) << stale;
    EXPECT_EQ(file.tensors[i].tensor.dtype(), DType::f64);
    ASSERT_EQ(file.tensors[i].tensor.shape(), expected[i].tensor.shape()) << stale;
    EXPECT_EQ(file.tensors[i].tensor.to_vector<double>(), expected[i].tensor.to_vector<double>()) << stale;
  }
  GPT2Config config = GPT2Config::from_json(read_json_file(config_path), config_path);
  EXPECT_EQ(config.vocab_size, 67);
  EXPECT_EQ(config.block_size, 16);
  EXPECT_EQ(config.n_layer, 2);
  EXPECT_EQ(config.n_head, 2);
  EXPECT_EQ(config.n_embd, 8);
  EXPECT_TRUE(config.bias);
  EXPECT_TRUE(config.tie_embeddings);
}

// The logits of scripts/gpt2_numpy_reference.py, an independent numpy GPT-2, for the fixture weights.
TEST(GPT2Fixture, LogitsMatchTheNumpyReference) {
  train::SafetensorsFile reference = train::read_safetensors((kFixtureDir / "logits.safetensors").string());
  ASSERT_EQ(reference.tensors.size(), 2u);
  const Tensor& idx = reference.tensors[0].tensor;
  const Tensor& expected = reference.tensors[1].tensor;
  ASSERT_EQ(reference.tensors[0].name, "idx");
  ASSERT_EQ(idx.shape(), Shape({2, 11}));
  ASSERT_EQ(expected.shape(), Shape({2, 11, 67}));

  // float64: agreement to rounding error.
  GPT2 model(tiny_config(), /*seed=*/1);
  convert_parameters(model, DType::f64);
  train::load_checkpoint((kFixtureDir / "model.safetensors").string(), model);
  NoGradGuard no_grad;
  model.eval();
  Tensor logits = model.forward(idx).logits;
  EXPECT_EQ(logits.dtype(), DType::f64);
  precis::testing::expect_close(logits, expected, 1e-12, 1e-10);

  // float32 (the weights converted on load): agreement to float32 precision.
  GPT2 model_f32(tiny_config(), /*seed=*/1);
  train::load_checkpoint((kFixtureDir / "model.safetensors").string(), model_f32);
  model_f32.eval();
  precis::testing::expect_close(model_f32.forward(idx).logits.to(DType::f64), expected, 1e-5, 1e-5);
}

// Autograd through the whole model against central differences of the loss, on
// sampled elements of a few parameters of every kind, in float64.
TEST(GPT2, WholeModelGradientCheck) {
  for (bool tied : {true, false}) {
    SCOPED_TRACE(tied ? "tied" : "untied");
    GPT2 model(tiny_config(tied), 3);
    convert_parameters(model, DType::f64);
    randomize(model, 100, 0.4);
    const int64_t T = 7;
    Tensor idx = random_tokens({2, T}, 1), targets = random_tokens({2, T}, 2);
    auto loss_value = [&] {
      NoGradGuard no_grad;
      return model.forward(idx, targets).loss.item();
    };
    model.forward(idx, targets).loss.backward();

    struct Probe {
      std::string name;
      int64_t rows;  // elements are sampled from the first `rows` rows (the real vocabulary, the used positions)
    };
    std::vector<Probe> probes = {{"transformer.wte.weight", 67},          {"transformer.wpe.weight", T},
                                 {"transformer.h.0.ln_1.weight", 1},      {"transformer.h.0.attn.c_attn.weight", 24},
                                 {"transformer.h.0.attn.c_attn.bias", 1}, {"transformer.h.1.attn.c_proj.weight", 8},
                                 {"transformer.h.1.ln_2.bias", 1},        {"transformer.h.1.mlp.c_fc.weight", 32},
                                 {"transformer.h.0.mlp.c_proj.bias", 1},  {"transformer.ln_f.weight", 1}};
    // c_proj's biases are added by the norms after them (the last one by ln_f): their gradients come from those.
    probes.push_back({"transformer.h.0.attn.c_proj.bias", 1});
    probes.push_back({"transformer.h.1.mlp.c_proj.bias", 1});
    if (!tied) probes.push_back({"lm_head.weight", 67});
    std::mt19937_64 rng(17);
    const double eps = 1e-5;
    for (const Probe& probe : probes) {
      Tensor p = parameter(model, probe.name);
      ASSERT_TRUE(p.grad().defined()) << probe.name;
      std::vector<double> grad = p.grad().to_vector<double>();
      double* data = p.data<double>();
      const int64_t limit = p.dim() == 2 ? probe.rows * p.size(1) : p.numel();
      for (int k = 0; k < 6; ++k) {
        const int64_t i = static_cast<int64_t>(rng() % static_cast<uint64_t>(limit));
        const double saved = data[i];
        data[i] = saved + eps;
        const double plus = loss_value();
        data[i] = saved - eps;
        const double minus = loss_value();
        data[i] = saved;
        const double numeric = (plus - minus) / (2 * eps);
        EXPECT_NEAR(grad[i], numeric, 1e-8 + 1e-5 * std::abs(numeric)) << probe.name << " element " << i;
      }
    }
    // Rows of the padded vocabulary get no gradient.
    Tensor padded_grad = model.wte().grad().slice(0, 67, 128);
    EXPECT_EQ(padded_grad.to_vector<double>(), std::vector<double>(61 * 8, 0.0));
  }
}

TEST(GPT2, PaddedLogitsNeverAffectTheLoss) {
  for (bool tied : {true, false}) {
    SCOPED_TRACE(tied ? "tied" : "untied");
    GPT2 model(tiny_config(tied), 4);
    ASSERT_EQ(model.config().padded_vocab_size(), 128);
    Tensor idx = random_tokens({2, 9}, 5), targets = random_tokens({2, 9}, 6);
    GPT2Output before = model.forward(idx, targets);
    ASSERT_EQ(before.logits.shape(), Shape({2, 9, 67}));
    {
      NoGradGuard no_grad;
      fill_(model.lm_head_weight().slice(0, 67, 128), 50.0);
    }
    GPT2Output after = model.forward(idx, targets);
    EXPECT_EQ(after.logits.to_vector<float>(), before.logits.to_vector<float>());
    EXPECT_EQ(after.loss.item(), before.loss.item());
    after.loss.backward();
    EXPECT_EQ(model.lm_head_weight().grad().slice(0, 67, 128).to_vector<float>(), std::vector<float>(61 * 8, 0.0f));
  }
}

TEST(GPT2, PaddedWidthLossMatchesTheCutOffClassifier) {
  // The loss of forward() (logits at the padded width, the real columns scored in place) against
  // the classifier cut to the real vocabulary before the product: the same loss and gradients.
  for (bool tied : {true, false}) {
    SCOPED_TRACE(tied ? "tied" : "untied");
    GPT2 model(tiny_config(tied), 8);
    convert_parameters(model, DType::f64);
    randomize(model, 300, 0.4);
    Tensor idx = random_tokens({2, 9}, 9);
    std::vector<int64_t> t = random_tokens({2, 9}, 10).to_vector<int64_t>();
    t[2] = t[13] = -100;  // ignored positions
    Tensor targets = from_vector(t, {2, 9});
    Tensor loss = model.forward(idx, targets).loss;
    loss.backward();
    std::vector<std::pair<std::string, Tensor>> grads;
    for (const auto& [name, p] : model.named_parameters()) grads.emplace_back(name, p.grad().detach().contiguous());
    model.zero_grad();
    Tensor head = model.lm_head_weight().slice(0, 0, 67);
    Tensor cut_off =
        ops::cross_entropy(ops::linear(model.hidden_states(idx), head).reshape({-1, 67}), targets.reshape({-1}));
    cut_off.backward();
    EXPECT_NEAR(loss.item(), cut_off.item(), 1e-13);
    for (const auto& [name, grad] : grads) {
      SCOPED_TRACE(name);
      precis::testing::expect_close(grad, parameter(model, name).grad(), 1e-14, 1e-10);
    }
  }
}

TEST(GPT2, FusedClassifierGivesTheGradientsOfTheScaledLoss) {
  // forward(idx, targets, loss_gradient) makes the logits' gradient in the loss's pass and
  // backward() starts from the logits: the same loss and parameter gradients, to the bit, as
  // (loss * factor).backward() (the CPU's kernels are the same), tied and untied, ignored targets.
  for (bool tied : {true, false}) {
    SCOPED_TRACE(tied ? "tied" : "untied");
    GPT2 model(tiny_config(tied), 12);
    randomize(model, 310, 0.4);
    Tensor idx = random_tokens({2, 9}, 11);
    std::vector<int64_t> t = random_tokens({2, 9}, 12).to_vector<int64_t>();
    t[4] = -100;
    Tensor targets = from_vector(t, {2, 9});
    const double factor = 0.25;
    Tensor loss = model.forward(idx, targets).loss;
    (loss * factor).backward();
    std::vector<std::pair<std::string, Tensor>> grads;
    for (const auto& [name, p] : model.named_parameters()) grads.emplace_back(name, p.grad().detach().clone());
    model.zero_grad();

    GPT2Output fused = model.forward(idx, targets, scalar_tensor(factor, DType::f32));
    ASSERT_TRUE(fused.fused_classifier());
    EXPECT_FALSE(fused.logits.defined()) << "the logits' memory holds their gradient";
    EXPECT_EQ(fused.loss.item(), loss.item());
    fused.backward();
    for (const auto& [name, grad] : grads) {
      SCOPED_TRACE(name);
      precis::testing::expect_close(grad, parameter(model, name).grad(), 0, 0);
    }
  }
  // Without grad recording (evaluation), or without targets, the plain forward runs.
  GPT2 model(tiny_config(), 13);
  Tensor idx = random_tokens({1, 5}, 14), targets = random_tokens({1, 5}, 15);
  {
    NoGradGuard no_grad;
    GPT2Output out = model.forward(idx, targets, scalar_tensor(1.0, DType::f32));
    EXPECT_FALSE(out.fused_classifier());
    EXPECT_TRUE(out.logits.defined());
  }
  EXPECT_FALSE(model.forward(idx, Tensor(), scalar_tensor(1.0, DType::f32)).fused_classifier());
}

TEST(GPT2, GenerateIsReproducibleAndTopOneIsGreedy) {
  GPT2 model(tiny_config(), 11);
  randomize(model, 200, 1.0);
  {
    // Padded rows with the largest scores would win every draw if they were not cut off.
    NoGradGuard no_grad;
    fill_(model.wte().slice(0, 67, 128), 3.0);
  }
  const std::vector<int32_t> prompt = {5, 17, 42, 0, 66};
  const int64_t n = 20;  // prompt + n exceeds block_size: the context window slides

  std::vector<int32_t> a = model.generate(prompt, n, 1.0, 0, 123);
  std::vector<int32_t> b = model.generate(prompt, n, 1.0, 0, 123);
  std::vector<int32_t> c = model.generate(prompt, n, 1.0, 0, 124);
  ASSERT_EQ(a.size(), static_cast<size_t>(n));
  EXPECT_EQ(a, b) << "the same seed must give the same tokens";
  EXPECT_NE(a, c) << "another seed should give other tokens";
  for (int32_t t : a) EXPECT_TRUE(t >= 0 && t < 67) << t;
  EXPECT_TRUE(model.is_training()) << "generate restores the training mode";

  // Greedy decoding by hand: the argmax of the last position's logits, over the last block_size tokens.
  std::vector<int32_t> tokens = prompt, greedy;
  {
    NoGradGuard no_grad;
    model.eval();
    for (int64_t step = 0; step < n; ++step) {
      size_t start = tokens.size() > 16 ? tokens.size() - 16 : 0;
      std::vector<int32_t> window(tokens.begin() + static_cast<int64_t>(start), tokens.end());
      Tensor idx = from_vector(window, {1, static_cast<int64_t>(window.size())});
      std::vector<float> logits = model.forward(idx).logits.select(1, -1).to_vector<float>();
      int32_t best = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
      tokens.push_back(best);
      greedy.push_back(best);
    }
    model.train();
  }
  EXPECT_EQ(model.generate(prompt, n, 0.7, 1, 1), greedy);
  EXPECT_EQ(model.generate(prompt, n, 1.3, 1, 2), greedy);
}
