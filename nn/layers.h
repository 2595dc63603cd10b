// The small layers: Embedding, LayerNorm, Dropout, GELU, ReLU, Flatten.
#pragma once

#include "core/random.h"
#include "nn/module.h"

namespace precis::nn {

// out[..., :] = weight[idx[...], :], weight: [num_embeddings, dim], initialised N(0, 1) as PyTorch.
class Embedding : public Module {
 public:
  Embedding(int64_t num_embeddings, int64_t dim, DType dtype = DType::f32);
  Tensor forward(const Tensor& indices) override;
  Tensor weight;
};

// Layer norm over the last dim with learnable weight (ones) and optional bias (zeros).
class LayerNorm : public Module {
 public:
  explicit LayerNorm(int64_t dim, bool bias = true, double eps = 1e-5, DType dtype = DType::f32);
  Tensor forward(const Tensor& x) override;
  Tensor weight;
  Tensor bias;
  double eps;
};

// Zeroes elements with probability p in training mode, from `gen` (the default generator when null).
class Dropout : public Module {
 public:
  explicit Dropout(double p, Generator* gen = nullptr);
  Tensor forward(const Tensor& x) override;
  double p;

 private:
  Generator* gen_;
};

// GELU, tanh approximation (as GPT-2).
class GELU : public Module {
 public:
  GELU() : Module("GELU") {}
  Tensor forward(const Tensor& x) override;
};

class ReLU : public Module {
 public:
  ReLU() : Module("ReLU") {}
  Tensor forward(const Tensor& x) override;
};

// [N, d1, d2, ...] -> [N, d1 * d2 * ...] (torch.nn.Flatten with start_dim 1), in the logical
// (NCHW) order whatever the memory layout.
class Flatten : public Module {
 public:
  Flatten() : Module("Flatten") {}
  Tensor forward(const Tensor& x) override;
};

}  // namespace precis::nn
