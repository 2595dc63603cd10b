#include "nn/pool.h"

#include "ops/pool.h"

namespace precis::nn {

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
