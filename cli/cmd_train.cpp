#include <iostream>

#include "cli/commands.h"
#include "cli/usage.h"
#include "core/error.h"
#include "train/config.h"
#include "train/trainer.h"

namespace precis::cli {

int train_command(const Args& args) {
  usage_check(!args.empty(), "train", "give a config file, e.g. `precis train examples/configs/shakespeare-char.yaml`");
  std::vector<std::string> overrides(args.begin() + 1, args.end());
  for (const auto& o : overrides)
    usage_check(o.find('=') != std::string::npos, "train",
                "'" + o + "' is not an override; write key=value, e.g. max_steps=100");
  train::TrainConfig config = train::load_config(args[0], overrides);
  train::Trainer trainer(config);
  trainer.run();
  return 0;
}

}  // namespace precis::cli
