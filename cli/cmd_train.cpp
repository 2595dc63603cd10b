#include <iostream>

#include "cli/commands.h"
#include "cli/usage.h"
#include "core/error.h"
#include "train/config.h"
#include "train/trainer.h"

namespace precis::cli {

int train_command(const Args& args) {
  usage_check(!args.empty(), "train", "give a config file, e.g. `precis train examples/configs/shakespeare-char.yaml`");
  std::vector<std::string> overrides;
  for (auto it = args.begin() + 1; it != args.end(); ++it) {
    // --synthetic: the config's model and step on synthetic images, as `precis bench resnet` runs
    // them (a CIFAR-10 config without the CIFAR-10 files, say); the config's own override first.
    if (*it == "--synthetic") {
      overrides.insert(overrides.begin(), "data.dataset=synthetic");
      continue;
    }
    usage_check(it->find('=') != std::string::npos, "train",
                "'" + *it + "' is not an override; write key=value, e.g. max_steps=100, or --synthetic");
    overrides.push_back(*it);
  }
  train::TrainConfig config = train::load_config(args[0], overrides);
  train::Trainer trainer(config);
  trainer.run();
  return 0;
}

}  // namespace precis::cli
