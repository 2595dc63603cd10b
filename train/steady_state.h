// The steady-state figures of a run: the log intervals after warm-up merged
// into one mean per step, weighted by the steps in each interval. The
// benchmark (`precis bench`) reports these.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "train/step_report.h"

namespace precis::train {

struct SteadyState {
  int64_t steps = 0;                                     // steps measured
  double ms_per_step = 0;                                // mean wall time per step
  std::vector<std::pair<std::string, double>> phase_ms;  // mean per step, in first-seen order
  int64_t peak_memory_bytes = 0;  // the most allocated during the measured intervals (their own peaks)
};

// Merges the intervals of `reports` (in step order) that begin at or after
// step `from_step`; the earlier ones are warm-up.
SteadyState steady_state(const std::vector<StepReport>& reports, int64_t from_step);

}  // namespace precis::train
