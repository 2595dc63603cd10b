// Batch normalisation over the channel dim (dim 1) of [N, C, ...] tensors (either memory
// format for 4-D, ops/conv.h).
#pragma once

#include "core/tensor.h"

namespace precis::ops {

// y = (x - mean) / sqrt(var + eps) * weight + bias per channel (dim 1). training: mean/var
// are the batch's (biased var for normalising); running_mean/running_var (f32 [C], may be
// undefined) are updated in place: r = (1 - momentum) * r + momentum * batch_stat, with the
// UNBIASED batch variance for running_var (PyTorch's rule). eval: running stats are used.
// Statistics in f32 under f16/bf16 inputs. weight/bias [C] (f32 or x's dtype) or undefined.
// The result keeps x's dtype and layout (autocast leaves it in x's dtype).
// num_batches_tracked (an i64 scalar on x's device, or undefined): a training forward adds 1 to
// it, on the device with the statistics (no kernel of its own; nothing read back).
Tensor batch_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                  const Tensor& running_var, bool training, double momentum = 0.1, double eps = 1e-5,
                  const Tensor& num_batches_tracked = Tensor());
// relu(batch_norm(...)), one pass each way: the backward masks the gradient with y > 0.
Tensor batch_norm_relu(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                       const Tensor& running_var, bool training, double momentum = 0.1, double eps = 1e-5,
                       const Tensor& num_batches_tracked = Tensor());
// relu(batch_norm(x, ...) + residual): the join of a ResNet block in one pass each way (the sum
// in f32, rounded once). residual has x's shape and dtype (copied into x's layout if it comes
// in another); its gradient is g [y > 0], which the backward's statistics pass writes.
Tensor batch_norm_add_relu(const Tensor& x, const Tensor& residual, const Tensor& weight, const Tensor& bias,
                           const Tensor& running_mean, const Tensor& running_var, bool training, double momentum = 0.1,
                           double eps = 1e-5, const Tensor& num_batches_tracked = Tensor());

}  // namespace precis::ops
