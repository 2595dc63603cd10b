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
  void step() override;
  const AdamWOptions& options() const { return options_; }

 private:
  AdamWOptions options_;
};

}  // namespace precis::optim
