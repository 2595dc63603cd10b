// Linear: y = x W^T + b, W: [out_features, in_features] (as torch.nn.Linear).
#pragma once

#include "nn/module.h"

namespace precis::nn {

struct LinearOptions {
  bool bias = true;
  DType dtype = DType::f32;
};

class Linear : public Module {
 public:
  // Weights start as PyTorch's default, uniform(-1/sqrt(in), 1/sqrt(in)); models re-initialise them.
  Linear(int64_t in_features, int64_t out_features, LinearOptions options = {});
  Tensor forward(const Tensor& x) override;

  Tensor weight;
  Tensor bias;  // undefined without bias
};

}  // namespace precis::nn
