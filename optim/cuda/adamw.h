// The fused AdamW update on the GPU (optim/adamw.cpp calls it for CUDA parameters; plain
// C++ declarations).
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
#include "optim/cuda/step_inputs.h"

namespace precis::optim::cuda {

inline constexpr int kAdamWBatch = 256;

// One parameter: all dense, on one device. param f32/f64 with a gradient and moments
// of its dtype; or param f32/f16/bf16 with an f32, f16 or bf16 gradient, f32 moments and
// for f16/bf16 an optional f32 master copy (then the update runs on the master and the
// parameter gets it rounded); compute_copy as SGDTensors' (optim/cuda/sgd.h).
// peer_offsets: byte offsets from each element of param where its new value is stored too
// (Optimizer::set_peer_copies: other ranks' copies; at most Optimizer::kMaxPeerCopies, and at
// most kAdamWPeerSets different lists in one step).
struct AdamWTensors {
  Tensor param, grad, exp_avg, exp_avg_sq, master, compute_copy;
  double weight_decay = 0.0;
  uint64_t index = 0;  // the parameter's index in the optimizer (stochastic rounding's counter)
  std::vector<int64_t> peer_offsets;
};

inline constexpr int kAdamWPeerSets = 4;  // one per flat parameter buffer

// The step's constants: p <- p (1 - lr wd) - (lr / bias1) m / (sqrt(v) / sqrt(bias2) + eps),
// after m <- b1 m + (1 - b1) g, v <- b2 v + (1 - b2) g^2 (optim/adamw.h), with bias_k = 1 - b_k^t.
struct AdamWHyper {
  double beta1 = 0, beta2 = 0, eps = 0;
  // bf16 parameters only: round the f32 result stochastically with Philox bits of
  // (seed; element / 4, step << 32 | index), as optim/low_precision.h does on the CPU.
  bool stochastic_rounding = false;
  uint64_t seed = 0;
};

// One step with the learning rate, the step count (advanced here unless skipped), the
// gradient factor and the skip flag read from device memory: nothing is baked into the
// launches, so a CUDA graph can replay them.
void adamw_step(const std::vector<AdamWTensors>& params, const AdamWHyper& hyper, const DeviceStepInputs& inputs);

}  // namespace precis::optim::cuda
