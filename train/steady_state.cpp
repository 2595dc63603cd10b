#include "train/steady_state.h"

#include <algorithm>

namespace precis::train {

SteadyState steady_state(const std::vector<StepReport>& reports, int64_t from_step) {
  SteadyState out;
  double total_ms = 0;
  int64_t interval_start = 0;
  for (const StepReport& r : reports) {
    const int64_t steps = r.step - interval_start;
    const bool measured = interval_start >= from_step;
    interval_start = r.step;
    if (!measured || steps <= 0) continue;
    out.steps += steps;
    total_ms += r.ms * static_cast<double>(steps);
    out.peak_memory_bytes = std::max(out.peak_memory_bytes, r.interval_peak_memory_bytes);
    for (const auto& [name, ms] : r.phase_ms) {
      auto slot =
          std::find_if(out.phase_ms.begin(), out.phase_ms.end(), [&](const auto& p) { return p.first == name; });
      if (slot == out.phase_ms.end()) slot = out.phase_ms.insert(out.phase_ms.end(), {name, 0.0});
      slot->second += ms * static_cast<double>(steps);
    }
  }
  if (out.steps == 0) return out;
  out.ms_per_step = total_ms / static_cast<double>(out.steps);
  for (auto& [name, ms] : out.phase_ms) ms /= static_cast<double>(out.steps);
  return out;
}

}  // namespace precis::train
