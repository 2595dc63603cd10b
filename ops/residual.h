// The join of a residual block (ResNet): relu(x + residual) in one pass each way, in x's
// memory format (ops/conv.h). ops::relu(ops::add(...)) takes two passes each way and returns
// a contiguous NCHW tensor, so a channels-last network would leave that layout at every block.
#pragma once

#include "core/tensor.h"

namespace precis::ops {

// y = max(0, x + residual), x and residual of one shape and dtype (the sum in f32 for
// f16/bf16, rounded once). The gradient of both is g [y > 0].
Tensor add_relu(const Tensor& x, const Tensor& residual);

}  // namespace precis::ops
