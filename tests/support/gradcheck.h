// Test helpers: random f64 inputs and a gradient check against central differences.
#pragma once

#include <functional>
#include <vector>

#include "core/tensor.h"

namespace precis::testing {

// Uniform in [low, high), float64, seeded (so failures reproduce).
Tensor random_f64(const Shape& shape, uint64_t seed, double low = -1.0, double high = 1.0);

using TensorFn = std::function<Tensor(const std::vector<Tensor>& inputs)>;

// For every floating input, compares the gradient autograd computes for
// sum(fn(inputs) * w) (w a fixed random weighting) with central differences
// (f(x + eps) - f(x - eps)) / 2 eps, element by element. Inputs should be f64.
// Adds a GoogleTest failure naming the input and element for each mismatch.
void expect_gradients_match(const TensorFn& fn, std::vector<Tensor> inputs, double eps = 1e-6, double atol = 1e-6,
                            double rtol = 1e-5);

// Element-wise |a - b| <= atol + rtol |b|, with a failure message naming the first bad index.
void expect_close(const Tensor& actual, const Tensor& expected, double atol = 1e-6, double rtol = 1e-5);

}  // namespace precis::testing
