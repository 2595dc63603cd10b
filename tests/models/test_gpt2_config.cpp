// GPT2Config: the presets are OpenAI's sizes, and its JSON form (config.json) reads back
// exactly what it wrote, reads Hugging Face's own file, and names what is wrong.
#include <gtest/gtest.h>

#include "models/gpt2_config.h"
#include "support/errors.h"

namespace precis::models {
namespace {

using precis::testing::error_of;

TEST(GPT2Config, PresetsAreTheReleasedSizes) {
  // The released checkpoints' sizes, and their parameter counts as Hugging Face lists them.
  struct Expected {
    const char* name;
    int64_t n_layer, n_head, n_embd, parameters_millions;
  };
  const std::vector<Expected> expected = {{"gpt2", 12, 12, 768, 124},
                                          {"gpt2-medium", 24, 16, 1024, 355},
                                          {"gpt2-large", 36, 20, 1280, 774},
                                          {"gpt2-xl", 48, 25, 1600, 1558}};
  ASSERT_EQ(GPT2Config::preset_names().size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    SCOPED_TRACE(expected[i].name);
    EXPECT_EQ(GPT2Config::preset_names()[i], expected[i].name);
    GPT2Config c = GPT2Config::preset(expected[i].name);
    EXPECT_EQ(c.n_layer, expected[i].n_layer);
    EXPECT_EQ(c.n_head, expected[i].n_head);
    EXPECT_EQ(c.n_embd, expected[i].n_embd);
    EXPECT_EQ(c.vocab_size, 50257);
    EXPECT_EQ(c.block_size, 1024);
    // Parameters of the tied model: embeddings V C + T C, per layer 12 C^2 + 13 C, final norm 2 C.
    const int64_t C = c.n_embd;
    int64_t parameters = c.vocab_size * C + c.block_size * C + c.n_layer * (12 * C * C + 13 * C) + 2 * C;
    EXPECT_EQ((parameters + 500000) / 1000000, expected[i].parameters_millions);
  }
  EXPECT_EQ(error_of([] { GPT2Config::preset("gpt3"); }),
            "unknown GPT-2 preset 'gpt3' (use gpt2, gpt2-medium, gpt2-large or gpt2-xl)");
}

// Every field the JSON stores, away from its default, through the text a file holds.
TEST(GPT2Config, JsonRoundTripsEveryStoredField) {
  GPT2Config c;
  c.vocab_size = 67;
  c.block_size = 48;
  c.n_layer = 3;
  c.n_head = 5;
  c.n_embd = 40;
  c.dropout = 0.125;
  c.bias = false;
  c.tie_embeddings = false;
  c.vocab_multiple = 8;
  GPT2Config back = GPT2Config::from_json(Json::parse(c.to_json().dump()));
  EXPECT_EQ(back, c);
  EXPECT_EQ(back.to_json(), c.to_json());

  GPT2Config defaults;
  EXPECT_EQ(GPT2Config::from_json(Json::parse(defaults.to_json().dump())), defaults);
  // How to run it is this machine's choice, not part of the model.
  c.attention = "reference";
  EXPECT_EQ(GPT2Config::from_json(c.to_json()).attention, "flash");
}

TEST(GPT2Config, JsonIsHuggingFacesLayout) {
  Json j = GPT2Config::preset("gpt2-medium").to_json();
  EXPECT_EQ(j.at("model_type").as_string(), "gpt2");
  EXPECT_EQ(j.at("architectures").at(0).as_string(), "GPT2LMHeadModel");
  EXPECT_EQ(j.at("n_positions").as_int(), 1024);
  EXPECT_EQ(j.at("n_layer").as_int(), 24);
  EXPECT_EQ(j.at("n_head").as_int(), 16);
  EXPECT_EQ(j.at("n_embd").as_int(), 1024);
  EXPECT_EQ(j.at("activation_function").as_string(), "gelu_new");
  EXPECT_TRUE(j.at("tie_word_embeddings").as_bool());
}

// The keys of the config.json Hugging Face publishes for gpt2 (abridged): no "bias" or
// "vocab_multiple", dropout 0.1.
TEST(GPT2Config, ReadsHuggingFacesOwnConfig) {
  Json hf = Json::parse(R"({"activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"],
      "attn_pdrop": 0.1, "bos_token_id": 50256, "embd_pdrop": 0.1, "eos_token_id": 50256,
      "initializer_range": 0.02, "layer_norm_epsilon": 1e-05, "model_type": "gpt2", "n_ctx": 1024,
      "n_embd": 768, "n_head": 12, "n_layer": 12, "n_positions": 1024, "resid_pdrop": 0.1, "vocab_size": 50257})");
  GPT2Config expected = GPT2Config::preset("gpt2");
  expected.dropout = 0.1;
  EXPECT_EQ(GPT2Config::from_json(hf), expected);
}

TEST(GPT2Config, JsonErrorsNameTheSourceAndTheKey) {
  Json j = GPT2Config().to_json();
  Json no_positions = Json::object();
  for (const auto& [key, value] : j.as_object())
    if (key != "n_positions") no_positions[key] = value;
  EXPECT_EQ(error_of([&] { GPT2Config::from_json(no_positions, "ckpt/config.json"); }),
            "ckpt/config.json: \"n_positions\" must be a positive integer");
  Json relu = j;
  relu["activation_function"] = "relu";
  EXPECT_EQ(error_of([&] { GPT2Config::from_json(relu, "ckpt/config.json"); }),
            "ckpt/config.json: activation_function \"relu\" is not GPT-2's tanh GELU (\"gelu_new\")");
  Json bad_dropout = j;
  bad_dropout["resid_pdrop"] = 1.5;
  EXPECT_EQ(error_of([&] { GPT2Config::from_json(bad_dropout, "ckpt/config.json"); }),
            "ckpt/config.json: \"resid_pdrop\" must be a number in [0, 1)");
  EXPECT_EQ(error_of([] { GPT2Config::from_json(Json::array(), "x.json"); }),
            "x.json: expected a JSON object with the GPT-2 configuration");
}

}  // namespace
}  // namespace precis::models
