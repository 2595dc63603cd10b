// Learning-rate schedules: constant, or linear warmup then cosine decay to a
// minimum (nanoGPT's get_lr):
//   step < warmup:            lr * (step + 1) / (warmup + 1)
//   step > decay_steps:       min_lr
//   otherwise:                min_lr + 0.5 (1 + cos(pi r)) (lr - min_lr),  r = (step - warmup) / (decay_steps - warmup)
#pragma once

#include <cstdint>
#include <string>

namespace precis::optim {

struct LrSchedule {
  std::string kind = "cosine";  // "constant" or "cosine"
  double lr = 1e-3;
  double min_lr = 1e-4;
  int64_t warmup_steps = 0;
  int64_t decay_steps = 1000;  // cosine reaches min_lr here

  double at(int64_t step) const;
};

}  // namespace precis::optim
