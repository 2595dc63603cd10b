// The CUDA embedding (ops/cuda/embedding.cu), plain C++ launchers on Tensors:
// ops/embedding.cpp validates, allocates the outputs on the device and calls them; they run
// on the compute stream of their tensors' device.
#pragma once

#include "core/tensor.h"
#include "ops/cuda/bad_index.h"

namespace precis::ops::cuda {

// out [N, C] = weight[indices[n], :]; weight [rows, C] with unit column stride; indices
// dense i32/i64. Synchronises once to read back the index check (as cross_entropy_forward).
BadIndex embedding_forward(const Tensor& weight, const Tensor& indices, const Tensor& out);
// dweight [rows, C] (dense, grad_rows' dtype) = scatter-add of grad_rows [N, C] (dense) by
// indices, deterministic: the indices are sorted, and each weight row sums its gradient rows
// in order, in f32, rounded once. With `accumulate` the sums are added to what dweight holds
// (rounded once: a parameter's .grad, written where it lies) instead of written over it.
void embedding_backward(const Tensor& grad_rows, const Tensor& indices, const Tensor& dweight, bool accumulate = false);

}  // namespace precis::ops::cuda
