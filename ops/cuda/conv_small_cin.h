// A network's first convolution on the GPU: 3x3, stride 1, padding 1, over an image of 2 to 4
// channels (RGB: ResNet's CIFAR stem), channels-last, as an im2col of ours and cuBLASLt products
// instead of cuDNN's call (ops/cuda/conv_small_cin.cu says why and how). Include only from ops/cuda/*.cu files.
#pragma once

#include <initializer_list>

#include "core/tensor.h"
#include "ops/cuda/conv.h"

namespace precis::ops::cuda {

// Whether the kernels here take the problem: ops::small_cin_conv() on; channels-last; f32,
// f16 or bf16; 2 to 4 input channels, output channels a multiple of 8, one group, a
// 3x3 filter with stride 1, padding 1 and dilation 1; every buffer 16-byte aligned.
bool small_cin_conv_applies(const Conv2dShapes& s, MemoryFormat format, DType dtype,
                            std::initializer_list<const Tensor*> buffers);

// y = conv(x, w): x [N, H, W, Cin], w [Cout, 3, 3, Cin] (KRSC), y [N, H, W, Cout], dense.
void small_cin_conv_forward(const Tensor& x, const Tensor& w, const Tensor& y, const Conv2dShapes& s);
// dw = the gradient of conv(x, w) with respect to w, from gy: dw [Cout, 3, 3, Cin] (KRSC) of x's dtype.
void small_cin_conv_backward_filter(const Tensor& x, const Tensor& gy, const Tensor& dw, const Conv2dShapes& s);

}  // namespace precis::ops::cuda
