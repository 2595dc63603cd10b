// The few kernels core/ itself needs: strided copy with dtype conversion,
// fill, and in-place accumulation (for leaf gradients). They work on any
// strides and any dtype pair, on the CPU and (with CUDA) on the GPU. And the
// copies a kernel's launcher makes of operands it cannot read as they are.
#pragma once

#include "core/tensor.h"

namespace precis {

// dst[i] = convert(src[i]); shapes must be equal; devices may differ (host<->device copies).
void copy_(const Tensor& dst, const Tensor& src);
// dst[i] = value
void fill_(const Tensor& dst, double value);
// dst[i] += src[i]; same shape; src is converted to dst's dtype.
void accumulate_(const Tensor& dst, const Tensor& src);

// `t` in `dtype` on its device: t itself when it already is (any strides), else a dense
// converted copy. No autograd.
Tensor converted(const Tensor& t, DType dtype);
// `t` dense, in `dtype` (its own by default), on its device: t itself when it already is,
// else a dense converted copy. No autograd.
Tensor dense(const Tensor& t, DType dtype);
Tensor dense(const Tensor& t);

}  // namespace precis
