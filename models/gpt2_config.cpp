#include "models/gpt2_config.h"

#include <algorithm>
#include <iterator>

#include "core/error.h"

namespace precis::models {

namespace {

struct Preset {
  const char* name;
  int64_t n_layer, n_head, n_embd;
};
// The GPT-2 family as released by OpenAI; all share the vocabulary and context length.
constexpr Preset kPresets[] = {
    {"gpt2", 12, 12, 768}, {"gpt2-medium", 24, 16, 1024}, {"gpt2-large", 36, 20, 1280}, {"gpt2-xl", 48, 25, 1600}};

}  // namespace

GPT2Config GPT2Config::preset(const std::string& name) {
  auto found =
      std::find_if(std::begin(kPresets), std::end(kPresets), [&](const Preset& preset) { return name == preset.name; });
  PRECIS_CHECK(found != std::end(kPresets), "unknown GPT-2 preset '", name,
               "' (use gpt2, gpt2-medium, gpt2-large or gpt2-xl)");
  GPT2Config c;
  c.n_layer = found->n_layer;
  c.n_head = found->n_head;
  c.n_embd = found->n_embd;
  return c;
}

const std::vector<std::string>& GPT2Config::preset_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> list;
    for (const Preset& preset : kPresets) list.push_back(preset.name);
    return list;
  }();
  return names;
}

double GPT2Config::flops_per_token_forward(int64_t seq_len) const {
  // Matmul parameters: per layer 12 C^2 (qkv 3C^2, proj C^2, mlp 8C^2), plus the classifier V C.
  double C = static_cast<double>(n_embd);
  double matmul_params = static_cast<double>(n_layer) * 12.0 * C * C + static_cast<double>(padded_vocab_size()) * C;
  double attention = 2.0 * static_cast<double>(n_layer) * static_cast<double>(seq_len) * C;  // QK^T and AV
  return 2.0 * matmul_params + attention;
}

Json GPT2Config::to_json() const {
  Json j = Json::object();
  j["architectures"] = Json(Json::Array{Json("GPT2LMHeadModel")});
  j["model_type"] = "gpt2";
  j["vocab_size"] = vocab_size;
  j["n_positions"] = block_size;
  j["n_embd"] = n_embd;
  j["n_layer"] = n_layer;
  j["n_head"] = n_head;
  j["n_inner"] = nullptr;
  j["activation_function"] = "gelu_new";
  j["layer_norm_epsilon"] = 1e-5;
  j["resid_pdrop"] = dropout;
  j["embd_pdrop"] = dropout;
  j["attn_pdrop"] = dropout;
  j["tie_word_embeddings"] = tie_embeddings;
  j["bias"] = bias;
  j["vocab_multiple"] = vocab_multiple;
  return j;
}

GPT2Config GPT2Config::from_json(const Json& j, const std::string& source) {
  PRECIS_CHECK(j.is_object(), source, ": expected a JSON object with the GPT-2 configuration");
  auto integer = [&](const char* key) {
    PRECIS_CHECK(j.contains(key) && j.at(key).is_integer() && j.at(key).as_int() > 0, source, ": \"", key,
                 "\" must be a positive integer");
    return j.at(key).as_int();
  };
  auto flag = [&](const char* key, bool fallback) {
    if (!j.contains(key)) return fallback;
    PRECIS_CHECK(j.at(key).is_bool(), source, ": \"", key, "\" must be true or false");
    return j.at(key).as_bool();
  };
  GPT2Config c;
  c.vocab_size = integer("vocab_size");
  c.block_size = integer("n_positions");
  c.n_embd = integer("n_embd");
  c.n_layer = integer("n_layer");
  c.n_head = integer("n_head");
  c.tie_embeddings = flag("tie_word_embeddings", c.tie_embeddings);
  c.bias = flag("bias", c.bias);
  if (j.contains("vocab_multiple")) c.vocab_multiple = integer("vocab_multiple");
  if (j.contains("resid_pdrop")) {
    const Json& p = j.at("resid_pdrop");
    PRECIS_CHECK(p.is_number() && p.as_double() >= 0 && p.as_double() < 1, source,
                 ": \"resid_pdrop\" must be a number in [0, 1)");
    c.dropout = p.as_double();
  }
  if (j.contains("activation_function"))
    PRECIS_CHECK(j.at("activation_function") == Json("gelu_new"), source, ": activation_function ",
                 j.at("activation_function").dump(), " is not GPT-2's tanh GELU (\"gelu_new\")");
  return c;
}

}  // namespace precis::models
