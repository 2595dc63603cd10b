#include "nn/batch_norm.h"

#include "ops/batch_norm.h"

namespace precis::nn {

BatchNorm2d::BatchNorm2d(int64_t channels, double eps_in, double momentum_in)
    : Module("BatchNorm2d"), eps(eps_in), momentum(momentum_in) {
  PRECIS_CHECK(channels > 0, "BatchNorm2d: channels must be positive, got ", channels);
  PRECIS_CHECK(eps > 0 && momentum >= 0 && momentum <= 1, "BatchNorm2d: eps must be > 0 and momentum in [0, 1], got ",
               eps, " and ", momentum);
  weight = register_parameter("weight", ones({channels}));
  bias = register_parameter("bias", zeros({channels}));
  running_mean = register_buffer("running_mean", zeros({channels}));
  running_var = register_buffer("running_var", ones({channels}));
  num_batches_tracked = register_buffer("num_batches_tracked", zeros({}, DType::i64));
}

Tensor BatchNorm2d::forward(const Tensor& x) {
  return ops::batch_norm(x, weight, bias, running_mean, running_var, is_training(), momentum, eps, num_batches_tracked);
}

Tensor BatchNorm2d::forward_relu(const Tensor& x) {
  return ops::batch_norm_relu(x, weight, bias, running_mean, running_var, is_training(), momentum, eps,
                              num_batches_tracked);
}

Tensor BatchNorm2d::forward_add_relu(const Tensor& x, const Tensor& residual) {
  return ops::batch_norm_add_relu(x, residual, weight, bias, running_mean, running_var, is_training(), momentum, eps,
                                  num_batches_tracked);
}

}  // namespace precis::nn
