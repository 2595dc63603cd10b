// Settings a resume cannot change (docs/config.md, "Resuming"): the optimizer (its state is
// per optimizer) and how parameters are stored (their dtype and master weights shape the
// optimizer state). Checked against the checkpoint's train state before anything is loaded,
// so the error says which setting changed and what to do, not how a tensor does not fit.
#pragma once

#include <string>

#include "amp/precision_policy.h"
#include "core/json.h"
#include "train/config.h"

namespace precis::train {

// Throws a precis::Error naming the key, both values and the way out; checkpoints written
// before a key was recorded are not checked for it.
void check_resume_compatible(const Json& saved_state, const TrainConfig& config, const amp::PrecisionPolicy& policy,
                             const std::string& checkpoint);

}  // namespace precis::train
