// Non-finite training (docs/config.md, `on_nonfinite`). Every policy skips a step whose
// gradients hold inf or NaN on the device, with no read-back: clip_grad_norm sets the loss
// scaler's found_inf (also when the scaler does not scale), the optimizer skips on it and the
// scaler's update counts the run of skipped steps (amp/scaler_state.h). The trainer reads that
// count where it reads values back anyway (a log line, a checkpoint, the end) and at least
// every max_nonfinite_steps steps, and stops the run here. Checkpoints never hold non-finite
// values: the checks below run before one is written and after one is read.
#pragma once

#include <cstdint>
#include <string>

#include "core/tensor.h"
#include "train/config.h"

namespace precis::train {

// Throws StoppedRun (kExitNonFinite) under `on_nonfinite: stop` once `consecutive` steps in a
// row were skipped (>= max_nonfinite_steps): the message says what happened, which
// checkpoint in `checkpoint_dir` is the newest good one, and what to change.
void enforce_nonfinite_rule(const TrainConfig& config, int64_t step, int64_t consecutive);

// The index of the first inf or NaN element of `t` (any device: copied to the host), or -1
// when every element is finite or `t` is not floating point.
int64_t first_nonfinite(const Tensor& t);

}  // namespace precis::train
