// precis profile CONFIG.yaml [key=value ...] [--steps N] [--warmup W]: a short
// run of the config whose steps after the warm-up are profiled op by op
// (core/op_profile.h): the per-op table with each op on the device's roofline,
// the Amdahl table and the roofline plot (docs/profiling.md). No validation,
// samples or checkpoints; CUDA graphs are off (a replayed graph has no ops to time).
#include <iostream>

#include "cli/bench_common.h"
#include "cli/commands.h"
#include "core/error.h"
#include "core/gpu.h"
#include "core/op_profile.h"
#include "train/config.h"
#include "train/trainer.h"

namespace precis::cli {

namespace {

const char* kUsage = "usage: precis profile CONFIG.yaml [key=value ...] [--steps N] [--warmup W]";

// The value of --name as a count of at least `min`.
int64_t count_option(const Options& o, const std::string& name, int64_t fallback, int64_t min) {
  const std::string text = o.get(name, std::to_string(fallback));
  size_t used = 0;
  int64_t value = min - 1;
  try {
    value = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  PRECIS_CHECK(used == text.size() && value >= min, "profile: --", name, " must be an integer >= ", min, ", got '",
               text, "'; ", kUsage);
  return value;
}

}  // namespace

int profile_command(const Args& args) {
  Options o = parse_options(args, {"steps", "warmup"}, "profile");
  PRECIS_CHECK(!o.positional.empty(), "profile: give a config file; ", kUsage);
  const int64_t steps = count_option(o, "steps", 3, 1), warmup = count_option(o, "warmup", 2, 0);
  std::vector<std::string> overrides(o.positional.begin() + 1, o.positional.end());
  for (const auto& kv : overrides)
    PRECIS_CHECK(kv.find('=') != std::string::npos, "profile: '", kv, "' is not an override; write key=value");
  train::TrainConfig base = train::load_config(o.positional[0], overrides);
  if (base.cuda_graphs) std::cout << "note: profile runs without CUDA graphs (a replayed graph has no ops to time)\n";
  if (!base.profile.trace.empty())
    std::cout << "note: profile.trace is left out (the profile records the kernels of its steps itself)\n";
  overrides.insert(overrides.end(),
                   {"cuda_graphs=false", "profile.trace=", "eval_interval=0", "sample.tokens=0",
                    "checkpoint.save_final=false", "checkpoint.interval=0",
                    "max_steps=" + std::to_string(warmup + steps), "log_interval=" + std::to_string(warmup + steps)});
  train::TrainConfig config = train::load_config(o.positional[0], overrides);
  train::Trainer trainer(config);
  OpProfile profile(resolve_device(config.device, /*quiet=*/true), /*trace_kernels=*/true);
  trainer.profile_ops(&profile, warmup + 1);
  trainer.run();
  if (trainer.rank() != 0) return 0;
  print_profile(trainer, profile);
  return 0;
}

}  // namespace precis::cli
