// Where a GPU optimizer step finds its per-step numbers: device memory, so that
// nothing is read back or baked into a launch (plain C++; optim/optimizer.h's
// StepInputs, the learning rate and the step count as device pointers).
#pragma once

#include <cstdint>

namespace precis::optim::cuda {

struct DeviceStepInputs {
  const double* lr = nullptr;              // the learning rate
  int64_t* step = nullptr;                 // the step count t: t <- t + 1 first, unless skipped
  const double* grad_factor = nullptr;     // or null: each gradient is multiplied by it as it is read
  const double* skip = nullptr;            // or null: when *skip != 0 nothing is updated and t stays
  bool round_scaled_grads_to_f32 = false;  // StepInputs::round_scaled_grads_to_f32 (a value: fixed for a run)
};

}  // namespace precis::optim::cuda
