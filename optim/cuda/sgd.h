// SGD on the GPU (optim/sgd.cpp calls it for CUDA parameters; plain C++ declarations):
// optim/sgd_rule.h's update, up to 256 parameters a launch, after a one-thread kernel that
// reads the step's numbers from device memory.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "optim/cuda/step_inputs.h"
#include "optim/sgd_rule.h"

namespace precis::optim::cuda {

// One parameter, dense, all on one device: param f32/f64 with a gradient and momentum
// buffer of its dtype, or f32/f16/bf16 with an f32, f16 or bf16 gradient, an f32 momentum
// buffer and for f16/bf16 an optional f32 master copy (updated in its place; the parameter
// gets it rounded). momentum_buffer is undefined without momentum; compute_copy, for an f32
// parameter, an f16/bf16 tensor of its layout that gets the new value rounded
// (Optimizer::set_compute_copies), else undefined.
struct SGDTensors {
  Tensor param, grad, momentum_buffer, master, compute_copy;
  double weight_decay = 0.0;
  uint64_t index = 0;  // the parameter's index in the optimizer (stochastic rounding's counter)
};

struct SGDHyper {
  SGDRule rule;
  bool stochastic_rounding = false;  // bf16 parameters: optim/low_precision.h's rounding
  uint64_t seed = 0;
};

void sgd_step(const std::vector<SGDTensors>& params, const SGDHyper& hyper, const DeviceStepInputs& inputs);

}  // namespace precis::optim::cuda
