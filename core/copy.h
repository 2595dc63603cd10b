// The few kernels core/ itself needs: strided copy with dtype conversion,
// fill, and in-place accumulation (for leaf gradients). They work on any
// strides and any dtype pair, on the CPU and (with CUDA) on the GPU.
#pragma once

#include "core/tensor.h"

namespace precis {

// dst[i] = convert(src[i]); shapes must be equal; devices may differ (host<->device copies).
void copy_(const Tensor& dst, const Tensor& src);
// dst[i] = value
void fill_(const Tensor& dst, double value);
// dst[i] += src[i]; same shape; src is converted to dst's dtype.
void accumulate_(const Tensor& dst, const Tensor& src);

}  // namespace precis
