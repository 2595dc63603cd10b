#include "nn/init.h"

#include <cmath>

#include "core/copy.h"
#include "core/error.h"

namespace precis::nn::init {

void normal_(const Tensor& t, double mean, double std, Generator* gen) {
  copy_(t, randn(t.shape(), DType::f32, gen, mean, std));
}

void uniform_(const Tensor& t, double low, double high, Generator* gen) {
  copy_(t, rand(t.shape(), DType::f32, gen, low, high));
}

void zeros_(const Tensor& t) { fill_(t, 0.0); }
void ones_(const Tensor& t) { fill_(t, 1.0); }

namespace {

int64_t receptive_field(const Tensor& weight) {
  PRECIS_CHECK(weight.dim() >= 2, "init: a weight needs at least 2 dims for its fans, got ", weight.shape());
  int64_t size = 1;
  for (int64_t d = 2; d < weight.dim(); ++d) size *= weight.size(d);
  return size;
}

}  // namespace

int64_t fan_in(const Tensor& weight) { return weight.size(1) * receptive_field(weight); }
int64_t fan_out(const Tensor& weight) { return weight.size(0) * receptive_field(weight); }

void default_uniform_(const Tensor& weight, const Tensor& bias, Generator* gen) {
  const double bound = 1.0 / std::sqrt(static_cast<double>(fan_in(weight)));
  uniform_(weight, -bound, bound, gen);
  if (bias.defined()) uniform_(bias, -bound, bound, gen);
}

void kaiming_normal_fan_out_(const Tensor& weight, Generator* gen) {
  normal_(weight, 0.0, std::sqrt(2.0 / static_cast<double>(fan_out(weight))), gen);
}

}  // namespace precis::nn::init
