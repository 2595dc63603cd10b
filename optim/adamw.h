// AdamW (Loshchilov & Hutter): Adam with decoupled weight decay, as torch.optim.AdamW.
//
//   p <- p - lr * wd * p
//   m <- b1 m + (1 - b1) g          v <- b2 v + (1 - b2) g^2
//   p <- p - lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)
//
// f32/f64 parameters update in place with a gradient of their dtype. f16/bf16
// parameters take an f32 (or same-dtype) gradient; the update runs in f32 on
// the master copy (master_weights) or on the widened parameter, and is rounded
// back into the parameter (optim/low_precision.h).
#pragma once

#include "optim/optimizer.h"

namespace precis::optim {

struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  bool master_weights = true;        // f16/bf16 parameters: update an f32 copy kept in the state
  bool stochastic_rounding = false;  // bf16 parameters: round the f32 result stochastically
  uint64_t seed = 0;                 // Philox seed of the stochastic rounding
};

class AdamW : public Optimizer {
 public:
  AdamW(std::vector<ParamGroup> groups, AdamWOptions options = {});
  // The CPU loop, or on a GPU the fused kernel (optim/cuda/adamw.h) with the learning rate,
  // the step count and `inputs` read from device memory (nothing read back or baked in:
  // capturable into a CUDA graph). The same per-element arithmetic on both.
  void step(const StepInputs& inputs = {}) override;
  const AdamWOptions& options() const { return options_; }
  int64_t state_bytes_per_element(DType param_dtype) const override;
  bool supports_peer_copies() const override { return true; }  // the GPU kernel stores them

 private:
  // Checks parameter `index` and its gradient: device, layout, dtypes (optim/low_precision.h).
  void check_param(size_t index, const Tensor& p) const;

  AdamWOptions options_;
};

}  // namespace precis::optim
