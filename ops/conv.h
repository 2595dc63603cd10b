// Convolution and the memory formats of image tensors.
//
// Image tensors have the logical shape [N, C, H, W] (PyTorch's convention). Their memory is
// contiguous NCHW or channels-last (NHWC in memory: strides [H*W*C, 1, W*C, C], exactly
// torch.channels_last). Every CNN op (ops/conv.h, ops/batch_norm.h, ops/pool.h) accepts both
// and returns its result in the layout of its input x (PyTorch's "suggest_memory_format").
// conv2d runs on cuDNN on the GPU (ops/cuda/conv.cu) and as im2col + Eigen GEMM on the CPU.
#pragma once

#include <array>
#include <cstdint>

#include "core/tensor.h"

namespace precis::ops {

enum class MemoryFormat { contiguous, channels_last };

// A copy (or x itself when already so) in the given memory format; 4-D tensors only.
// Differentiable (the gradient comes back in x's layout).
Tensor to_memory_format(const Tensor& x, MemoryFormat format);
// Whether x is a 4-D tensor laid out channels-last (and not also contiguous NCHW, which a
// tensor with C == 1 or H == W == 1 is too).
bool is_channels_last(const Tensor& x);
// The memory format of x's result (channels_last when is_channels_last(x), else contiguous).
MemoryFormat suggest_memory_format(const Tensor& x);

struct Conv2dOptions {
  std::array<int64_t, 2> stride{1, 1}, padding{0, 0}, dilation{1, 1};
  int64_t groups = 1;
};

// y[n, co, oh, ow] = bias[co] + sum_{ci in co's group, kh, kw}
//     x[n, ci, oh*sh - ph + kh*dh, ow*sw - pw + kw*dw] * weight[co, ci - group start, kh, kw]
// (zero outside x). x [N, Cin, H, W], weight [Cout, Cin/groups, kH, kW], bias [Cout] or
// undefined. Autocast: runs in the compute dtype (like matmul).
Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias, const Conv2dOptions& options = {});

// GPU convolutions: time cuDNN's algorithms once per problem and keep the fastest (as PyTorch's
// cudnn.benchmark), instead of taking its heuristic's first answer. On by default; off gives
// the same algorithm, so the same rounding, in every process.
void set_cudnn_benchmark(bool benchmark);
bool cudnn_benchmark();

// Which cuDNN API runs GPU convolutions: the legacy one (cudnnConvolutionForward and its
// ~8 algorithms a direction, ops/cuda/conv.cu) or the graph (backend) API, whose engine
// configurations PyTorch times (ops/cuda/conv_graph.cu; a problem no engine runs there
// falls back to legacy). Until set, the environment's PRECIS_CUDNN_CONV=legacy|graph, read
// once; graph when unset (it reaches the engines PyTorch's convolutions run: bench/NOTES.md).
enum class CudnnConvApi { legacy, graph };
void set_cudnn_conv_api(CudnnConvApi api);
CudnnConvApi cudnn_conv_api();

// Whether the GPU backward computes the weight's gradient (cuDNN's backward-filter, and its
// widening into .grad) on the device's side stream (core/cuda/side_stream.h), beside the
// compute stream's backward-data convolution and the batch-norm backward that follows it,
// where autograd offers the leaf's .grad to write it into (core/autograd.h). The same kernels
// run, so the same bits result (ResNet-18's step: -3%, bench/NOTES.md). On by default; until
// set, the environment's PRECIS_WGRAD_STREAM=0 turns it off (read once).
void set_conv_wgrad_stream(bool on);
bool conv_wgrad_stream();

// Whether a channels-last 3x3 convolution (stride 1, padding 1) of an image of 2 to 4 channels,
// a network's first (ResNet's CIFAR stem), runs its forward and weight gradient as an im2col
// and cuBLASLt products (ops/cuda/conv_small_cin.cu) instead of cuDNN's call, which pads the
// image to 8 channels first (measured in bench/NOTES.md). On by default; until set,
// the environment's PRECIS_SMALL_CIN_CONV=0 turns it off (read once).
void set_small_cin_conv(bool on);
bool small_cin_conv();

}  // namespace precis::ops
