// SGD with momentum, Nesterov and L2 weight decay, as torch.optim.SGD:
//   g <- g + wd p;  buf <- momentum buf + (1 - dampening) g  (buf = g on the first step)
//   g <- nesterov ? g + momentum buf : buf;  p <- p - lr g
//
// Low-precision (f16/bf16) parameters as in AdamW: f32 math on the master copy
// (or the widened parameter), rounded back into the parameter.
#pragma once

#include "optim/optimizer.h"

namespace precis::optim {

struct SGDOptions {
  double lr = 1e-2;
  double momentum = 0.0;
  double dampening = 0.0;
  bool nesterov = false;
  bool master_weights = true;        // f16/bf16 parameters: update an f32 copy kept in the state
  bool stochastic_rounding = false;  // bf16 parameters: round the f32 result stochastically
  uint64_t seed = 0;                 // Philox seed of the stochastic rounding
};

class SGD : public Optimizer {
 public:
  SGD(std::vector<ParamGroup> groups, SGDOptions options = {});
  // The CPU loop, or on a GPU one kernel per parameter (optim/cuda/sgd.h) with the learning
  // rate, the step count and `inputs` read from device memory; optim/sgd_rule.h's arithmetic on both.
  void step(const StepInputs& inputs = {}) override;
  const SGDOptions& options() const { return options_; }
  int64_t state_bytes_per_element(DType param_dtype) const override;

 private:
  SGDOptions options_;
};

}  // namespace precis::optim
