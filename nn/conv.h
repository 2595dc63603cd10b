// Conv2d, as torch.nn.Conv2d, over ops::conv2d (ops/conv.h). Images are [N, C, H, W],
// contiguous or channels-last; the output keeps the input's layout.
#pragma once

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

}  // namespace precis::nn
