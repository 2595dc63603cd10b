#include <iostream>
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

int sample_command(const Args& args) {
  Options o = parse_options(args, {"prompt", "tokens", "temperature", "top-k", "seed", "device"}, "sample");
  usage_check(o.positional.size() == 1, "sample", "give one checkpoint directory");
  const std::string& path = o.positional[0];
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

  std::vector<int32_t> prompt = tokenizer->encode(o.get("prompt", "\n"));
  if (prompt.empty()) prompt.push_back(tokenizer->eot_token() >= 0 ? tokenizer->eot_token() : 0);
  std::vector<int32_t> out =
      model.generate(prompt, std::stoll(o.get("tokens", "200")), std::stod(o.get("temperature", "0.8")),
                     std::stoll(o.get("top-k", "40")), std::stoull(o.get("seed", "0")));
  std::cout << tokenizer->decode(prompt) << tokenizer->decode(out) << std::endl;
  return 0;
}

}  // namespace precis::cli
