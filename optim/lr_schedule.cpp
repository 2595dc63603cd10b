#include "optim/lr_schedule.h"

#include <cmath>

#include "core/error.h"

namespace precis::optim {

double LrSchedule::at(int64_t step) const {
  if (kind == "constant") return lr;
  PRECIS_CHECK(kind == "cosine", "lr schedule: unknown kind '", kind, "' (use constant or cosine)");
  if (step < warmup_steps) return lr * static_cast<double>(step + 1) / static_cast<double>(warmup_steps + 1);
  if (step > decay_steps) return min_lr;
  if (decay_steps <= warmup_steps) return min_lr;
  double ratio = static_cast<double>(step - warmup_steps) / static_cast<double>(decay_steps - warmup_steps);
  double coeff = 0.5 * (1.0 + std::cos(M_PI * ratio));
  return min_lr + coeff * (lr - min_lr);
}

}  // namespace precis::optim
