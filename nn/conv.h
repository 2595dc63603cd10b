// The image layers: Conv2d, BatchNorm2d and the pools, as torch.nn's, over the
// ops of ops/conv.h, ops/batch_norm.h and ops/pool.h. Images are [N, C, H, W],
// contiguous or channels-last; each layer keeps its input's layout.
#pragma once

#include <array>

#include "nn/module.h"
#include "ops/conv.h"

namespace precis::nn {

struct Conv2dOptions {
  int64_t kernel = 3;
  int64_t stride = 1;
  int64_t padding = 0;
  int64_t dilation = 1;
  int64_t groups = 1;
  bool bias = true;
  DType dtype = DType::f32;
};

// weight [out, in / groups, kernel, kernel], bias [out]; initialised as PyTorch's default
// (uniform in +-1/sqrt(fan_in)); models re-initialise them (ResNet: nn::init::kaiming_normal_fan_out_).
class Conv2d : public Module {
 public:
  Conv2d(int64_t in_channels, int64_t out_channels, Conv2dOptions options = {});
  Tensor forward(const Tensor& x) override;

  Tensor weight;
  Tensor bias;  // undefined without bias
  ops::Conv2dOptions op_options;
};

// Batch normalisation over dims (N, H, W) per channel (torch.nn.BatchNorm2d): weight (ones)
// and bias (zeros) are parameters; running_mean (zeros), running_var (ones) and
// num_batches_tracked (an i64 scalar, counting training forwards) are buffers, saved in
// checkpoints but not trained. Training mode normalises with the batch's statistics and
// updates the running ones with `momentum`; eval mode uses the running statistics.
class BatchNorm2d : public Module {
 public:
  explicit BatchNorm2d(int64_t channels, double eps = 1e-5, double momentum = 0.1);
  Tensor forward(const Tensor& x) override;
  // relu(forward(x)) in one op (ops::batch_norm_relu).
  Tensor forward_relu(const Tensor& x);

  Tensor weight, bias;
  Tensor running_mean, running_var, num_batches_tracked;
  double eps, momentum;

 private:
  void count_batch();
  Tensor one_;  // i64 1 on the buffers' device, added to num_batches_tracked
};

// max_pool2d / avg_pool2d with a square kernel; stride 0 means the kernel size (PyTorch's default).
class MaxPool2d : public Module {
 public:
  explicit MaxPool2d(int64_t kernel, int64_t stride = 0, int64_t padding = 0);
  Tensor forward(const Tensor& x) override;
  int64_t kernel, stride, padding;
};

class AvgPool2d : public Module {
 public:
  explicit AvgPool2d(int64_t kernel, int64_t stride = 0, int64_t padding = 0);
  Tensor forward(const Tensor& x) override;
  int64_t kernel, stride, padding;
};

class AdaptiveAvgPool2d : public Module {
 public:
  explicit AdaptiveAvgPool2d(std::array<int64_t, 2> output_size);
  Tensor forward(const Tensor& x) override;
  std::array<int64_t, 2> output_size;
};

}  // namespace precis::nn
