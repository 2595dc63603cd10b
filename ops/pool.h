// Pooling over the spatial dims of [N, C, H, W] tensors (either memory format, ops/conv.h);
// the result keeps x's dtype and layout (autocast leaves pools alone).
#pragma once

#include <array>
#include <cstdint>

#include "core/tensor.h"

namespace precis::ops {

// kernel, stride (default = kernel when {0, 0}), padding as PyTorch's max_pool2d /
// avg_pool2d (dilation 1, ceil_mode=false). max_pool2d pads with -inf; its gradient goes to
// the first maximum of each window. avg_pool2d counts the padding (count_include_pad=true).
Tensor max_pool2d(const Tensor& x, std::array<int64_t, 2> kernel, std::array<int64_t, 2> stride = {0, 0},
                  std::array<int64_t, 2> padding = {0, 0});
Tensor avg_pool2d(const Tensor& x, std::array<int64_t, 2> kernel, std::array<int64_t, 2> stride = {0, 0},
                  std::array<int64_t, 2> padding = {0, 0});
// Output cell (i, j) averages rows [floor(i H / oh), ceil((i + 1) H / oh)) and the same for
// columns (PyTorch's windows).
Tensor adaptive_avg_pool2d(const Tensor& x, std::array<int64_t, 2> output_size);

}  // namespace precis::ops
