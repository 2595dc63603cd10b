// Broadcasting an operand to an elementwise op's shape, for the CPU loops (ops/cpu/loops.h)
// and the CUDA launchers (ops/cuda/elementwise.cuh) alike.
#pragma once

#include "core/tensor.h"

namespace precis::ops {

// A view of `t` broadcast to `shape` (stride 0 along broadcast dims). No copy, no autograd.
Tensor broadcast_view(const Tensor& t, const Shape& shape, const char* op);

}  // namespace precis::ops
