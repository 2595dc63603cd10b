#include "nn/batch_norm.h"

#include "core/autograd.h"
#include "core/copy.h"
#include "ops/batch_norm.h"
#include "ops/elementwise.h"

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

// As PyTorch: each training forward counts one batch, on the buffers' device with nothing read
// back (so a captured step counts too). An i64 sum by ops::add (the GPU's accumulate_ sums
// floating gradients only, and a scalar add would go through f32).
void BatchNorm2d::count_batch() {
  if (!is_training()) return;
  NoGradGuard no_grad;
  if (!one_.defined() || one_.device() != num_batches_tracked.device())
    one_ = full({}, 1.0, DType::i64, num_batches_tracked.device());
  copy_(num_batches_tracked, ops::add(num_batches_tracked, one_));
}

Tensor BatchNorm2d::forward(const Tensor& x) {
  count_batch();
  return ops::batch_norm(x, weight, bias, running_mean, running_var, is_training(), momentum, eps);
}

Tensor BatchNorm2d::forward_relu(const Tensor& x) {
  count_batch();
  return ops::batch_norm_relu(x, weight, bias, running_mean, running_var, is_training(), momentum, eps);
}

}  // namespace precis::nn
