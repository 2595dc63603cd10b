// Joining and splitting tensors.
#pragma once

#include <vector>

#include "core/tensor.h"

namespace precis::ops {

Tensor cat(const std::vector<Tensor>& tensors, int64_t dim);
Tensor stack(const std::vector<Tensor>& tensors, int64_t dim);
// Pieces of `split_size` along dim (the last may be smaller). The pieces are views.
std::vector<Tensor> split(const Tensor& x, int64_t split_size, int64_t dim);
std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim);
// `chunks` pieces of ceil(size / chunks) along dim, as torch.chunk.
std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t dim);

}  // namespace precis::ops
