// The loss scaler's state as one small f64 tensor, and its update rule written once:
// the CPU loop (amp/grad_scaler.cpp) and the one-thread CUDA kernel
// (amp/cuda/grad_scaler.cu) both call advance_scaler_state on the same slots.
//
// Dynamic mode: an overflow step (found_inf) is skipped; after `hysteresis`
// consecutive overflow steps (and on every further one until a clean step) the
// scale backs off: scale = max(scale * backoff_factor, min_scale). Every
// `growth_interval` consecutive clean steps it grows: scale =
// min(scale * growth_factor, max_scale). Fixed mode, and a scaler that does not scale
// (rule.dynamic false), only count the skipped and the consecutive skipped steps (the
// trainer stops a run after too many: train/nonfinite.h). The counters are whole
// numbers, exact in f64.
#pragma once

#include <cstdint>

#include "core/philox.h"  // PRECIS_HOST_DEVICE

namespace precis::amp {

enum ScalerSlot : int64_t { kScale, kGrowthTracker, kConsecutiveOverflows, kSkippedSteps, kFoundInf, kScalerSlots };

// GradScalerOptions as the update reads them (plain numbers, a kernel argument).
struct ScalerRule {
  bool dynamic = true;
  double growth_factor = 2, backoff_factor = 0.5, min_scale = 1, max_scale = 1, growth_interval = 1, hysteresis = 1;
};

// One update of the state s[kScalerSlots] after a step whose overflow flag is s[kFoundInf].
PRECIS_HOST_DEVICE inline void advance_scaler_state(double* s, const ScalerRule& rule) {
  const bool found = s[kFoundInf] != 0;
  if (found) s[kSkippedSteps] += 1;
  s[kConsecutiveOverflows] = found ? s[kConsecutiveOverflows] + 1 : 0;
  if (!rule.dynamic) return;
  if (found) {
    s[kGrowthTracker] = 0;
    if (s[kConsecutiveOverflows] >= rule.hysteresis) {
      const double backed_off = s[kScale] * rule.backoff_factor;
      s[kScale] = backed_off < rule.min_scale ? rule.min_scale : backed_off;
    }
  } else {
    s[kGrowthTracker] += 1;
    if (s[kGrowthTracker] == rule.growth_interval) {
      const double grown = s[kScale] * rule.growth_factor;
      s[kScale] = rule.max_scale < grown ? rule.max_scale : grown;
      s[kGrowthTracker] = 0;
    }
  }
}

}  // namespace precis::amp
