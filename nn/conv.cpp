#include "nn/conv.h"

#include "core/copy.h"
#include "nn/init.h"
#include "ops/batch_norm.h"
#include "ops/pool.h"

namespace precis::nn {

Conv2d::Conv2d(int64_t in_channels, int64_t out_channels, Conv2dOptions options) : Module("Conv2d") {
  PRECIS_CHECK(in_channels > 0 && out_channels > 0 && options.kernel > 0 && options.groups > 0 &&
                   in_channels % options.groups == 0 && out_channels % options.groups == 0,
               "Conv2d: channels (", in_channels, " in, ", out_channels, " out) must be positive multiples of groups (",
               options.groups, ") and the kernel (", options.kernel, ") positive");
  weight = register_parameter(
      "weight", empty({out_channels, in_channels / options.groups, options.kernel, options.kernel}, options.dtype),
      /*weight_decay=*/true);
  if (options.bias) bias = register_parameter("bias", empty({out_channels}, options.dtype));
  init::default_uniform_(weight, bias);
  op_options.stride = {options.stride, options.stride};
  op_options.padding = {options.padding, options.padding};
  op_options.dilation = {options.dilation, options.dilation};
  op_options.groups = options.groups;
}

Tensor Conv2d::forward(const Tensor& x) { return ops::conv2d(x, weight, bias, op_options); }

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

// As PyTorch: each training forward counts one batch (on the buffers' device, nothing read back).
void BatchNorm2d::count_batch() {
  if (!is_training()) return;
  if (!one_.defined() || one_.device() != num_batches_tracked.device())
    one_ = full({}, 1.0, DType::i64, num_batches_tracked.device());
  accumulate_(num_batches_tracked, one_);
}

Tensor BatchNorm2d::forward(const Tensor& x) {
  count_batch();
  return ops::batch_norm(x, weight, bias, running_mean, running_var, is_training(), momentum, eps);
}

Tensor BatchNorm2d::forward_relu(const Tensor& x) {
  count_batch();
  return ops::batch_norm_relu(x, weight, bias, running_mean, running_var, is_training(), momentum, eps);
}

MaxPool2d::MaxPool2d(int64_t kernel_in, int64_t stride_in, int64_t padding_in)
    : Module("MaxPool2d"), kernel(kernel_in), stride(stride_in), padding(padding_in) {}

Tensor MaxPool2d::forward(const Tensor& x) {
  return ops::max_pool2d(x, {kernel, kernel}, {stride, stride}, {padding, padding});
}

AvgPool2d::AvgPool2d(int64_t kernel_in, int64_t stride_in, int64_t padding_in)
    : Module("AvgPool2d"), kernel(kernel_in), stride(stride_in), padding(padding_in) {}

Tensor AvgPool2d::forward(const Tensor& x) {
  return ops::avg_pool2d(x, {kernel, kernel}, {stride, stride}, {padding, padding});
}

AdaptiveAvgPool2d::AdaptiveAvgPool2d(std::array<int64_t, 2> size) : Module("AdaptiveAvgPool2d"), output_size(size) {}

Tensor AdaptiveAvgPool2d::forward(const Tensor& x) { return ops::adaptive_avg_pool2d(x, output_size); }

}  // namespace precis::nn
