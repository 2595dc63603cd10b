// The fused AdamW update on the GPU (optim/adamw.cpp calls it for CUDA parameters).
//
// Parameters are batched: one launch updates up to kAdamWBatch tensors whose
// parameter and gradient dtypes agree, each block taking a chunk of one tensor
// (the tensor table travels as a kernel argument, so nothing is copied to the
// device and nothing waits). Up to 256 tensors go in one launch (a ~20 KB argument; CUDA
// takes up to 32 KB since 12.1), so GPT-2's ~150 parameters are updated by one launch.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace precis::ops::cuda {

inline constexpr int kAdamWBatch = 256;

// One parameter: all dense, on one device. param f32/f64 with a gradient and moments
// of its dtype; or param f16/bf16 with an f32 or same-dtype gradient, f32 moments and
// an optional f32 master copy (then the update runs on the master and the parameter
// gets it rounded).
struct AdamWTensors {
  Tensor param, grad, exp_avg, exp_avg_sq, master;
  double weight_decay = 0.0;
  uint64_t index = 0;  // the parameter's index in the optimizer (stochastic rounding's counter)
};

// The step: p <- p (1 - lr wd) - (lr / bias1) m / (sqrt(v) / sqrt(bias2) + eps), after
// m <- b1 m + (1 - b1) g, v <- b2 v + (1 - b2) g^2 (optim/adamw.h), with bias_k = 1 - b_k^t.
struct AdamWStep {
  double lr = 0, beta1 = 0, beta2 = 0, eps = 0, bias1 = 1, bias2 = 1;
  // bf16 parameters only: round the f32 result stochastically with Philox bits of
  // (seed; element / 4, step << 32 | index), as optim/low_precision.h does on the CPU.
  bool stochastic_rounding = false;
  uint64_t seed = 0, step = 0;
};

void adamw_step(const std::vector<AdamWTensors>& params, const AdamWStep& step);

// Where the sync-free step (optim::AdamW::step_on_device) finds its numbers, all in device
// memory, so that nothing is baked into the launches and a CUDA graph can replay them.
struct AdamWDeviceInputs {
  const double* lr = nullptr;    // the learning rate
  int64_t* step = nullptr;       // the step count t: t <- t + 1 first (unless skipped), then bias_k = 1 - b_k^t
  const double* clip = nullptr;  // or null: each gradient is first multiplied by *clip, rounded to its dtype
  const double* skip = nullptr;  // or null: when *skip != 0 nothing is updated and t stays
};

// adamw_step with lr, the step count and the bias corrections read (and t advanced) on the
// device; `step` gives the betas, eps, and stochastic rounding's switch and seed.
void adamw_step_on_device(const std::vector<AdamWTensors>& params, const AdamWStep& step,
                          const AdamWDeviceInputs& inputs);

}  // namespace precis::ops::cuda
