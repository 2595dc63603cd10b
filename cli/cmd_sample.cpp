#include <iostream>
#include <limits>
#include <memory>

#include "cli/checkpoint_tokenizer.h"
#include "cli/commands.h"
#include "cli/usage.h"
#include "core/error.h"
#include "core/gpu.h"
#include "models/gpt2.h"
#include "nn/flat_parameters.h"
#include "train/checkpoint.h"

namespace precis::cli {

namespace {

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
  usage_check(o.positional.size() == 1, "sample", "give one checkpoint directory");
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
  std::unique_ptr<Tokenizer> tokenizer = checkpoint_tokenizer(state);
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
