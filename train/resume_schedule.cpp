#include "train/resume_schedule.h"

namespace precis::train {

ResumedSchedule resumed_schedule(const optim::LrSchedule& configured, bool decay_steps_from_max_steps,
                                 const std::optional<optim::LrSchedule>& saved) {
  if (!saved) return {configured, "schedule: " + configured.describe() + " (the checkpoint saved none)"};
  if (*saved == configured) return {configured, "schedule: " + configured.describe() + " (as saved)"};
  if (decay_steps_from_max_steps && saved->decay_steps != configured.decay_steps) {
    optim::LrSchedule kept = configured;
    kept.decay_steps = saved->decay_steps;
    return {kept, "schedule: " + kept.describe() +
                      " (the checkpoint's end, not max_steps=" + std::to_string(configured.decay_steps) +
                      "; set schedule.decay_steps=" + std::to_string(configured.decay_steps) + " to stretch it)"};
  }
  return {configured,
          "schedule: " + configured.describe() + " (the config's; the checkpoint's was " + saved->describe() + ")"};
}

}  // namespace precis::train
