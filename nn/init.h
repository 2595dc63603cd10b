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

}  // namespace precis::nn::init
