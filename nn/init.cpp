#include "nn/init.h"

#include "core/copy.h"

namespace precis::nn::init {

void normal_(const Tensor& t, double mean, double std, Generator* gen) {
  copy_(t, randn(t.shape(), DType::f32, gen, mean, std));
}

void uniform_(const Tensor& t, double low, double high, Generator* gen) {
  copy_(t, rand(t.shape(), DType::f32, gen, low, high));
}

void zeros_(const Tensor& t) { fill_(t, 0.0); }
void ones_(const Tensor& t) { fill_(t, 1.0); }

}  // namespace precis::nn::init
