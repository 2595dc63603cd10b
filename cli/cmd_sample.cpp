#include <iostream>
#include <limits>
#include <memory>

#include "cli/commands.h"
#include "core/error.h"
#include "core/gpu.h"
#include "data/char_tokenizer.h"
#include "data/gpt2_tokenizer.h"
#include "models/gpt2.h"
#include "nn/flat_parameters.h"
#include "train/checkpoint.h"

namespace precis::cli {

namespace {
// The tokenizer the run trained with: the char vocabulary saved in the train
// state, else GPT-2 BPE.
std::unique_ptr<Tokenizer> tokenizer_from(const Json& train_state) {
  if (train_state.is_object() && train_state.contains("tokenizer")) {
    const Json& t = train_state.at("tokenizer");
    if (t.contains("tokenizer") && t.at("tokenizer").as_string() == "char")
      return std::make_unique<CharTokenizer>(CharTokenizer::from_json(t, "the checkpoint's tokenizer"));
  }
  return std::make_unique<GPT2Tokenizer>();
}

struct SampleArgs {
  int64_t tokens, top_k;
  double temperature;
  uint64_t seed;
};

// The longest sample `precis sample` writes: far more than a sample is for, far less than
// a mistyped count ("1e9") would run for hours.
constexpr int64_t kMaxSampleTokens = 1'000'000;

SampleArgs sample_args(const Options& o) {
  SampleArgs a;
  a.tokens = o.integer("tokens", 200, 0, kMaxSampleTokens);
  a.temperature = o.number("temperature", 0.8, 1e-6, 1e6);
  a.top_k = o.integer("top-k", 40, 0, std::numeric_limits<int64_t>::max());
  a.seed = o.unsigned_integer("seed", 0);
  return a;
}
}  // namespace

int sample_command(const Args& args) {
  Options o = parse_options(args, {"prompt", "tokens", "temperature", "top-k", "seed", "device"}, "sample");
  PRECIS_CHECK(o.positional.size() == 1, "sample: usage: precis sample CHECKPOINT [--prompt TEXT] [--tokens N] ",
               "[--temperature T] [--top-k K] [--seed S] [--device auto|cpu|cuda]");
  const std::string& path = o.positional[0];
  // Checked before the checkpoint is read, so a typo costs no load; top-k once the vocabulary is known.
  const SampleArgs wanted = sample_args(o);
  std::optional<models::GPT2Config> config = train::checkpoint_model_config(path);
  PRECIS_CHECK(config.has_value(), "sample: no config.json beside the weights in '", path,
               "'; point at a checkpoint directory written by `precis train`");
  models::GPT2 model(*config);
  Device device = resolve_device(o.get("device", "auto"));
  nn::flatten_parameters(model, device);
  Json state = train::load_checkpoint(path, model, nullptr);
  std::unique_ptr<Tokenizer> tokenizer = tokenizer_from(state);
  PRECIS_CHECK(tokenizer->vocab_size() == config->vocab_size, "sample: the tokenizer has ", tokenizer->vocab_size(),
               " tokens but the model's vocabulary is ", config->vocab_size);
  PRECIS_CHECK(wanted.top_k <= config->vocab_size, "sample: --top-k ", wanted.top_k, " is more than the model's ",
               config->vocab_size, " tokens; give at most ", config->vocab_size, ", or 0 to sample from all of them");

  std::vector<int32_t> prompt = tokenizer->encode(o.get("prompt", "\n"));
  if (prompt.empty()) prompt.push_back(tokenizer->eot_token() >= 0 ? tokenizer->eot_token() : 0);
  std::vector<int32_t> out = model.generate(prompt, wanted.tokens, wanted.temperature, wanted.top_k, wanted.seed);
  std::cout << tokenizer->decode(prompt) << tokenizer->decode(out) << std::endl;
  return 0;
}

}  // namespace precis::cli
