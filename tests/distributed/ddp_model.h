// The tiny model of the DDP tests: y = fc2(tanh(fc1(x))), 4 -> 8 -> 3, with a mean
// squared error loss, parameters set by a formula (no random numbers), and a
// global batch every rank can compute and take its own rows of.
#pragma once

#include <cmath>
#include <memory>

#include "core/autograd.h"
#include "core/copy.h"
#include "nn/linear.h"
#include "ops/elementwise.h"
#include "ops/reduce.h"

namespace precis::testing {

// Parameter k's element i (in row-major order) = 0.5 sin(1.3 i + 0.7 k): deterministic values,
// the same in every process, whatever the random generator holds.
inline void set_parameters_by_formula(nn::Module& model) {
  NoGradGuard no_grad;
  int index = 0;
  for (const nn::NamedTensor& p : model.named_parameters()) {
    std::vector<double> values(p.tensor.numel());
    for (size_t i = 0; i < values.size(); ++i) values[i] = 0.5 * std::sin(1.3 * i + 0.7 * index);
    copy_(p.tensor, from_vector<double>(values, p.tensor.shape()));
    ++index;
  }
}

class TinyMlp : public nn::Module {
 public:
  // `with_unused`: a third layer the forward never calls (its parameters get no gradient).
  explicit TinyMlp(DType dtype, bool with_unused = false) : nn::Module("TinyMlp") {
    fc1 = register_module("fc1", std::make_shared<nn::Linear>(4, 8, nn::LinearOptions{.dtype = dtype}));
    fc2 = register_module("fc2", std::make_shared<nn::Linear>(8, 3, nn::LinearOptions{.dtype = dtype}));
    if (with_unused)
      unused = register_module("unused", std::make_shared<nn::Linear>(3, 3, nn::LinearOptions{.dtype = dtype}));
    set_parameters_by_formula(*this);
  }
  Tensor forward(const Tensor& x) override { return fc2->forward(ops::tanh(fc1->forward(x))); }

  std::shared_ptr<nn::Linear> fc1, fc2, unused;
};

struct Batch {
  Tensor x, y;  // [rows, 4], [rows, 3]
  // Rows [begin, begin + count), as dense tensors.
  Batch rows(int64_t begin, int64_t count) const {
    return {x.slice(0, begin, begin + count).contiguous(), y.slice(0, begin, begin + count).contiguous()};
  }
  Batch to(Device device) const { return {x.to(device), y.to(device)}; }
};

// Row i of the global batch: x[i, j] = sin(0.3 i + 0.7 j), y[i, k] = cos(0.5 i - 0.2 k).
inline Batch global_batch(int64_t rows, DType dtype) {
  std::vector<double> x(rows * 4), y(rows * 3);
  for (int64_t i = 0; i < rows; ++i) {
    for (int j = 0; j < 4; ++j) x[i * 4 + j] = std::sin(0.3 * i + 0.7 * j);
    for (int k = 0; k < 3; ++k) y[i * 3 + k] = std::cos(0.5 * i - 0.2 * k);
  }
  return {from_vector<double>(x, {rows, 4}).to(dtype), from_vector<double>(y, {rows, 3}).to(dtype)};
}

// mean((model(x) - y)^2) over every element, times `scale`.
inline Tensor mse_loss(TinyMlp& model, const Batch& batch, double scale = 1.0) {
  Tensor d = model.forward(batch.x) - batch.y;
  return ops::mean(d * d) * scale;
}

// The largest |a - b| over two models' gradients (or parameters), relative to the largest |b|.
inline double relative_difference(const std::vector<Tensor>& a, const std::vector<Tensor>& b) {
  double diff = 0, scale = 0;
  for (size_t t = 0; t < a.size(); ++t) {
    std::vector<double> va = a[t].to_vector<double>(), vb = b[t].to_vector<double>();
    for (size_t i = 0; i < va.size(); ++i) {
      diff = std::max(diff, std::abs(va[i] - vb[i]));
      scale = std::max(scale, std::abs(vb[i]));
    }
  }
  return scale > 0 ? diff / scale : diff;
}

inline std::vector<Tensor> grads_of(const nn::Module& model) {
  std::vector<Tensor> grads;
  for (const Tensor& p : model.parameters()) grads.push_back(p.grad());
  return grads;
}

}  // namespace precis::testing
