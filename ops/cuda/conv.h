// The GPU side of conv2d (ops/conv.cpp): cuDNN's forward, backward-data and backward-filter
// convolutions, and our kernel for the bias add, on the device's compute stream. Every
// tensor is dense in `format` (weights and their gradients too: cuDNN reads a channels-last
// filter as KRSC) and of one dtype (f32, f16 or bf16; f32 accumulation).
#pragma once

#include "core/tensor.h"
#include "ops/conv.h"

namespace precis::ops::cuda {

struct Conv2dShapes {
  int64_t N, Cin, H, W, Cout, kH, kW, OH, OW;
  Conv2dOptions options;
};

// y = conv(x, w)
void conv2d_forward(const Tensor& x, const Tensor& w, const Tensor& y, const Conv2dShapes& s, MemoryFormat format);
// y[:, c] += bias[c]; bias dense [Cout] of y's dtype.
void conv2d_add_bias(const Tensor& y, const Tensor& bias, MemoryFormat format);
// dx = the gradient of conv(x, w) with respect to x, from gy; with `accumulate`, dx += it.
void conv2d_backward_data(const Tensor& gy, const Tensor& w, const Tensor& dx, const Conv2dShapes& s,
                          MemoryFormat format, bool accumulate = false);
// dw = the gradient of conv(x, w) with respect to w, from gy
void conv2d_backward_filter(const Tensor& x, const Tensor& gy, const Tensor& dw, const Conv2dShapes& s,
                            MemoryFormat format);
// The same on the side stream of x's device (core/cuda/side_stream.h), written over `grad` (a
// leaf's .grad: dense, of dw's shape, in any dtype and layout) or, with `accumulate`, added to
// it: cuDNN writes dw dense in `format` and x's dtype, which is then copied or added into `grad`
// as autograd's AccumulateGrad would (the same calls, so the same bits; cuDNN's plan may depend
// on the output's alignment, so it does not write into `grad` itself). x and gy are
// record_stream'ed to the side stream, so that the caller may drop them at once.
void conv2d_backward_filter_on_side_stream(const Tensor& x, const Tensor& gy, const Tensor& grad, bool accumulate,
                                           const Conv2dShapes& s, MemoryFormat format);

// What the graph-API path (ops::CudnnConvApi::graph, ops/cuda/conv_graph.cu) has done in
// this process, for tests and benchmarks.
struct ConvGraphStats {
  int64_t runs = 0;       // convolutions it ran
  int64_t planned = 0;    // problems it chose a plan for (once each)
  int64_t timed = 0;      // of which by timing plans (cudnn_benchmark(), outside CUDA-graph captures)
  int64_t fell_back = 0;  // problems it has no plan for, left to the legacy API
  int64_t disagreed = 0;  // timed plain-f32 plans dropped for an output off the first plan's
};
ConvGraphStats conv_graph_stats();

// The forwards and weight gradients the small-channel kernels (ops::small_cin_conv(),
// ops/cuda/conv_small_cin.cu) have run in this process, for tests and benchmarks.
int64_t small_cin_conv_runs();

// For tests: where `position` >= 0, a timed problem keeps the plan at that position among its
// timed plans that ran and agree (the last where fewer), not the fastest; -1 restores the
// fastest. Either way the plans chosen so far are forgotten, so problems are planned again.
void set_conv_graph_pick_for_tests(int position);

}  // namespace precis::ops::cuda
