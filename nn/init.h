// Parameter initialisers. They write in place, outside autograd, from a
// Philox generator (the default one when null), so a seed fixes the model.
#pragma once

#include "core/random.h"
#include "core/tensor.h"

namespace precis::nn::init {

void normal_(const Tensor& t, double mean = 0.0, double std = 1.0, Generator* gen = nullptr);
void uniform_(const Tensor& t, double low = 0.0, double high = 1.0, Generator* gen = nullptr);
void zeros_(const Tensor& t);
void ones_(const Tensor& t);

// Fans of a weight [out, in, k...] (a Linear's [out, in] too): in * prod(k), out * prod(k).
int64_t fan_in(const Tensor& weight);
int64_t fan_out(const Tensor& weight);
// PyTorch's default for Linear and Conv2d (reset_parameters: kaiming_uniform_ with a = sqrt(5)):
// weight and bias (may be undefined) uniform in +-1/sqrt(fan_in).
void default_uniform_(const Tensor& weight, const Tensor& bias, Generator* gen = nullptr);
// kaiming_normal_(mode="fan_out", nonlinearity="relu"), torchvision's ResNet conv init:
// N(0, 2 / fan_out).
void kaiming_normal_fan_out_(const Tensor& weight, Generator* gen = nullptr);

}  // namespace precis::nn::init
