// The CNN ops' helpers for the two memory formats of [N, C, H, W] tensors (ops/conv.h):
// dense copies in a given format, new tensors in one, and the NHWC view of channels-last memory.
#pragma once

#include "core/tensor.h"
#include "ops/conv.h"

namespace precis::ops {

// The strides of a dense [N, C, H, W] tensor (or a [K, C, R, S] filter) in `format`.
Shape strides_of(const Shape& shape, MemoryFormat format);
// Whether t (4-D) is dense in `format`: its strides are the format's, ignoring dims of size 1.
bool is_dense_in(const Tensor& t, MemoryFormat format);
// A new [N, C, H, W] tensor laid out in `format`.
Tensor empty_in(const Shape& shape, MemoryFormat format, DType dtype, Device device);
// t dense in `format` and `dtype`: t itself when it already is, else a copy. No autograd.
Tensor dense_in(const Tensor& t, MemoryFormat format, DType dtype);
// Checks that x is a 4-D image tensor, naming `op` and `what` otherwise.
void require_image(const char* op, const Tensor& x, const char* what = "input");

}  // namespace precis::ops
