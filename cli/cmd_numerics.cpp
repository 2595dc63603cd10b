#include <iostream>

#include "cli/commands.h"
#include "cli/usage.h"
#include "core/error.h"
#include "train/config.h"
#include "train/trainer.h"

namespace precis::cli {

// A short run of CONFIG with the numerics report on: per-layer statistics of
// activations, gradients and updates every log interval (docs/precision.md).
int numerics_command(const Args& args) {
  usage_check(!args.empty(), "numerics", "give a config file (e.g. `precis numerics CONFIG.yaml precision=fp16`)");
  std::vector<std::string> overrides = {"precision.report=true", "sample.tokens=0", "max_steps=20", "log_interval=10"};
  overrides.insert(overrides.end(), args.begin() + 1, args.end());
  train::TrainConfig config = train::load_config(args[0], overrides);
  config.out_dir += "/numerics";
  // Each report is a new short run: it replaces the last one's checkpoints (train/run_folder.h).
  if (!config.checkpoint.resume) config.checkpoint.overwrite = true;
  train::Trainer trainer(config);
  trainer.run();
  std::cout << "numerics written to " << config.out_dir << "/numerics.jsonl\n";
  return 0;
}

}  // namespace precis::cli
