// The CUDA layer norm and add_layer_norm (ops/cuda/layer_norm.cu), plain C++ launchers on
// Tensors: ops/layer_norm.cpp validates, allocates the outputs on the device and calls them;
// they run on the compute stream of their tensors' device and do not synchronise.
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace precis::ops::cuda {

// Layer norm over the last dim of the dense x ([rows, C] when flattened): y, and per
// row mean and rstd. mean, rstd are dense, f32 (f64 for f64 x); weight, bias [C] (and
// residual_bias) dense, in that dtype too, or all three in x's dtype when that is f16/bf16
// (read so where the kernel allows, else cast here first). y is
// dense, in x's dtype, f32 for f16/bf16 x, or f16/bf16 for f32 x. With a residual
// (add_layer_norm; dense, x's shape, in x's dtype or f16/bf16 for f32 x), sum = x + residual
// (+ residual_bias, [C], added to every row, when defined) is
// written (dense, x's dtype; summed in f32 and rounded once) and normalised instead of x.
void layer_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps, const Tensor& y,
                        const Tensor& mean, const Tensor& rstd, const Tensor& residual = Tensor(),
                        const Tensor& sum = Tensor(), const Tensor& residual_bias = Tensor());
// dx, dweight, dbias (each skipped when undefined; dweight/dbias [C] in the statistics
// dtype, or in x's dtype where that is f16/bf16: a 16-bit .grad, the f32 sum rounded once), from the dense x (the
// values normalised), the dense gradient g (in y's dtype) and the saved statistics (weight in either dtype that
// layer_norm_forward takes). For add_layer_norm: g_sum (dense, x's dtype; the gradient of the sum) is added to dx, and
// dresidual (dense, in the residual's dtype) gets dx's values too; dresidual_bias ([C], statistics dtype or x's as
// dweight) gets the column sums of those values (the sum's whole gradient, summed unrounded, in a fixed order).
// accumulate_*: add to what dweight / dbias / dresidual_bias hold (a parameter's .grad, written where it lies) instead
// of writing over it.
void layer_norm_backward(const Tensor& x, const Tensor& g, const Tensor& weight, const Tensor& mean, const Tensor& rstd,
                         const Tensor& dx, const Tensor& dweight, const Tensor& dbias, const Tensor& g_sum = Tensor(),
                         const Tensor& dresidual = Tensor(), bool accumulate_dweight = false,
                         bool accumulate_dbias = false, const Tensor& dresidual_bias = Tensor(),
                         bool accumulate_dresidual_bias = false);

}  // namespace precis::ops::cuda
