// Which learning-rate schedule a resumed run follows. The schedule's end (decay_steps)
// defaults to max_steps, so resuming with a larger max_steps would silently re-stretch a
// cosine that is half done (the lr jumps back up). A resumed run therefore keeps the
// checkpoint's decay_steps unless the config sets schedule.decay_steps explicitly; every
// other schedule setting (kind, lr, min_lr, warmup, decay_fraction) is the config's, as
// written. The choice is said in one line.
#pragma once

#include <optional>
#include <string>

#include "optim/lr_schedule.h"

namespace precis::train {

struct ResumedSchedule {
  optim::LrSchedule schedule;
  std::string line;  // "schedule: ..." saying which one is used and why
};

// `configured`: the schedule the config describes; `decay_steps_from_max_steps`: its
// decay_steps was not given and came from max_steps; `saved`: the checkpoint's (nullopt for
// checkpoints written before schedules were saved: the config's is used).
ResumedSchedule resumed_schedule(const optim::LrSchedule& configured, bool decay_steps_from_max_steps,
                                 const std::optional<optim::LrSchedule>& saved);

}  // namespace precis::train
