// CUDA kernels of dropout (ops/dropout.cpp), callable from plain C++. The mask is
// drawn from the same Philox stream as the CPU's (core/philox.h), so for one
// generator state the CPU and the GPU drop the same elements.
#pragma once

#include <cstdint>
#include <utility>

#include "core/tensor.h"

namespace precis::ops::cuda {

// Element i (row-major, whatever x's strides) is kept iff uniform(philox_word(seed, offset, i)) >= p;
// kept elements are multiplied by `scale`. Returns (out, mask): out dense in x's dtype, mask a
// dense bool tensor of x's shape.
std::pair<Tensor, Tensor> dropout(const Tensor& x, double p, double scale, uint64_t seed, uint64_t offset);

// out[i] = mask[i] ? t[i] * scale : 0 (dropout's backward), in t's dtype.
Tensor apply_dropout_mask(const Tensor& t, const Tensor& mask, double scale);

}  // namespace precis::ops::cuda
