#include "nn/conv.h"

#include "nn/init.h"

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

}  // namespace precis::nn
