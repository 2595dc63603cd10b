// The pooling layers, as torch.nn's, over ops/pool.h; each keeps its input's memory layout.
#pragma once

#include <array>

#include "nn/module.h"

namespace precis::nn {

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
