#include "support/gradcheck.h"

#include <gtest/gtest.h>

#include <cmath>

#include "core/autograd.h"
#include "core/copy.h"
#include "core/random.h"
#include "ops/elementwise.h"
#include "ops/reduce.h"

namespace precis::testing {

Tensor random_f64(const Shape& shape, uint64_t seed, double low, double high) {
  Generator gen(seed);
  return rand(shape, DType::f64, &gen, low, high);
}

namespace {

// sum(out * w) evaluated in double on the host.
double weighted_sum(const Tensor& out, const std::vector<double>& w) {
  std::vector<double> values = out.to_vector<double>();
  double total = 0;
  for (size_t i = 0; i < values.size(); ++i) total += values[i] * w[i];
  return total;
}

}  // namespace

void expect_gradients_match(const TensorFn& fn, std::vector<Tensor> inputs, double eps, double atol, double rtol) {
  // Fresh leaves (sharing the callers' data), so gradients from earlier checks do not add in.
  for (Tensor& x : inputs) {
    x = x.detach();
    if (is_floating(x.dtype())) x.set_requires_grad(true);
  }
  Tensor out = fn(inputs);
  ASSERT_TRUE(out.requires_grad()) << "the function's output does not require grad";
  Tensor w = random_f64(out.shape(), 12345, 0.5, 1.5).to(out.dtype());
  std::vector<double> weights = w.to_vector<double>();
  ops::sum(ops::mul(out, w)).backward();

  for (size_t k = 0; k < inputs.size(); ++k) {
    Tensor& x = inputs[k];
    if (!is_floating(x.dtype())) continue;
    ASSERT_TRUE(x.grad().defined()) << "input " << k << " received no gradient";
    ASSERT_EQ(x.grad().shape(), x.shape()) << "input " << k << " gradient has the wrong shape";
    std::vector<double> analytic = x.grad().to_vector<double>();
    // Perturb a dense copy of the input, element by element.
    Tensor probe = x.detach().contiguous().clone();
    std::vector<Tensor> probe_inputs = inputs;
    for (Tensor& t : probe_inputs) t = t.detach();
    probe_inputs[k] = probe;
    NoGradGuard no_grad;
    double* p = static_cast<double*>(probe.raw_data());
    ASSERT_EQ(probe.dtype(), DType::f64) << "gradient checks need float64 inputs";
    int failures = 0;
    for (int64_t i = 0; i < probe.numel() && failures < 5; ++i) {
      double saved = p[i];
      p[i] = saved + eps;
      double plus = weighted_sum(fn(probe_inputs), weights);
      p[i] = saved - eps;
      double minus = weighted_sum(fn(probe_inputs), weights);
      p[i] = saved;
      double numeric = (plus - minus) / (2 * eps);
      if (std::abs(analytic[i] - numeric) > atol + rtol * std::abs(numeric)) {
        ADD_FAILURE() << "input " << k << " (shape " << x.shape() << "), element " << i << ": autograd gives "
                      << analytic[i] << ", central differences give " << numeric;
        ++failures;
      }
    }
  }
}

void expect_close(const Tensor& actual, const Tensor& expected, double atol, double rtol) {
  ASSERT_EQ(actual.shape(), expected.shape());
  std::vector<double> a = actual.to_vector<double>(), e = expected.to_vector<double>();
  for (size_t i = 0; i < a.size(); ++i) {
    bool both_nan = std::isnan(a[i]) && std::isnan(e[i]);
    bool same_inf = std::isinf(a[i]) && a[i] == e[i];
    if (both_nan || same_inf) continue;
    ASSERT_LE(std::abs(a[i] - e[i]), atol + rtol * std::abs(e[i]))
        << "element " << i << ": got " << a[i] << ", expected " << e[i] << " (shape " << actual.shape() << ")";
  }
}

}  // namespace precis::testing
