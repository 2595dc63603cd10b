#include "nn/layers.h"

#include "nn/init.h"
#include "ops/elementwise.h"
#include "ops/nn_functional.h"

namespace precis::nn {

Embedding::Embedding(int64_t num_embeddings, int64_t dim, DType dtype) : Module("Embedding") {
  PRECIS_CHECK(num_embeddings > 0 && dim > 0, "Embedding: sizes must be positive, got ", num_embeddings, " x ", dim);
  Tensor w = empty({num_embeddings, dim}, dtype);
  init::normal_(w, 0.0, 1.0);
  weight = register_parameter("weight", w);
}

Tensor Embedding::forward(const Tensor& indices) { return ops::embedding(weight, indices); }

LayerNorm::LayerNorm(int64_t dim, bool with_bias, double eps_in, DType dtype) : Module("LayerNorm"), eps(eps_in) {
  weight = register_parameter("weight", ones({dim}, dtype));
  if (with_bias) bias = register_parameter("bias", zeros({dim}, dtype));
}

Tensor LayerNorm::forward(const Tensor& x) { return ops::layer_norm(x, weight, bias, eps); }

Dropout::Dropout(double p_in, Generator* gen) : Module("Dropout"), p(p_in), gen_(gen) {
  PRECIS_CHECK(p >= 0.0 && p < 1.0, "Dropout: p must be in [0, 1), got ", p);
}

Tensor Dropout::forward(const Tensor& x) { return ops::dropout(x, p, is_training(), gen_); }

Tensor GELU::forward(const Tensor& x) { return ops::gelu(x); }

Tensor ReLU::forward(const Tensor& x) { return ops::relu(x); }

Tensor Flatten::forward(const Tensor& x) {
  PRECIS_CHECK(x.dim() >= 1, "Flatten: the input needs a batch dim, got a scalar");
  return x.reshape({x.size(0), -1});
}

}  // namespace precis::nn
