// Learning-rate schedules. Every kind starts with a linear warmup (nanoGPT's get_lr):
//   step < warmup:  lr * (step + 1) / (warmup + 1)
// then, with W = warmup, D = decay_steps (the step where the decay ends) and
// r = (step - W) / (D - W) the progress through the decay:
//   constant:      lr
//   cosine:        min_lr + 0.5 (1 + cos(pi r)) (lr - min_lr)                  (min_lr after D)
//   linear:        lr + r (min_lr - lr)                                        (min_lr after D)
//   wsd:           warmup-stable-decay: lr until S = D - round(decay_fraction (D - W)), then
//                  lr + s (min_lr - lr) with s = (step - S) / (D - S)          (min_lr after D)
//   inverse_sqrt:  lr * sqrt((W + 1) / (step + 1)), which is lr at step W and falls as
//                  1/sqrt(step) without end (decay_steps and min_lr are not used)
// Steps count from 0 (the first optimizer step is step 0).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/json.h"

namespace precis::optim {

struct LrSchedule {
  std::string kind = "cosine";  // constant | cosine | linear | wsd | inverse_sqrt
  double lr = 1e-3;
  double min_lr = 1e-4;
  int64_t warmup_steps = 0;
  int64_t decay_steps = 1000;   // cosine, linear and wsd reach min_lr here
  double decay_fraction = 0.2;  // wsd: the share of the steps after warmup spent decaying

  double at(int64_t step) const;

  // One line: "cosine from 0.0006 to 6e-05 at step 5000 after 100 warmup steps".
  std::string describe() const;
  // Every field (saved in checkpoints, so a resumed run can keep the schedule it started with).
  Json to_json() const;
  static LrSchedule from_json(const Json& json);
  bool operator==(const LrSchedule&) const = default;

  static const std::vector<std::string>& kinds();
};

}  // namespace precis::optim
