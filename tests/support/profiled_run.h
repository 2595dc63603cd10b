// A short training run of the demo configuration (support/demo_config.h) whose steps from
// `first_step` on are profiled op by op (core/op_profile.h), for the profiler's tests.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/gpu.h"
#include "core/op_profile.h"
#include "support/demo_config.h"
#include "train/trainer.h"

namespace precis::test {

struct ProfiledRun {
  std::unique_ptr<train::Trainer> trainer;
  std::unique_ptr<OpProfile> profile;
};

// Runs `max_steps` steps (set in `overrides`, with the device) and profiles those from `first_step`.
inline ProfiledRun profiled_run(const std::string& name, const std::vector<std::string>& overrides,
                                int64_t first_step) {
  ProfiledRun run;
  run.trainer = std::make_unique<train::Trainer>(demo_config(name, overrides));
  run.profile =
      std::make_unique<OpProfile>(resolve_device(run.trainer->config().device, /*quiet=*/true), /*trace_kernels=*/true);
  run.trainer->profile_ops(run.profile.get(), first_step);
  run.trainer->run();
  return run;
}

}  // namespace precis::test
