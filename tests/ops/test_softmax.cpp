#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "ops/ops.h"
#include "support/errors.h"
#include "support/gradcheck.h"

using namespace precis;
using precis::testing::expect_close;
using precis::testing::expect_error;
using precis::testing::expect_gradients_match;
using precis::testing::random_f64;

namespace {

// softmax computed naively in double along `dim`, by moving dim last: the reference.
Tensor reference_softmax(const Tensor& x, int64_t dim, bool log) {
  Tensor moved = x.to(DType::f64).transpose(dim, -1).contiguous();
  const int64_t n = moved.shape().back();
  std::vector<double> v = moved.to_vector<double>(), out(v.size());
  for (size_t base = 0; base < v.size(); base += n) {
    double m = -INFINITY, s = 0;
    for (int64_t i = 0; i < n; ++i) m = std::max(m, v[base + i]);
    for (int64_t i = 0; i < n; ++i) s += std::exp(v[base + i] - m);
    for (int64_t i = 0; i < n; ++i) out[base + i] = log ? v[base + i] - m - std::log(s) : std::exp(v[base + i] - m) / s;
  }
  return from_vector(out, moved.shape()).transpose(dim, -1);
}

}  // namespace

TEST(Softmax, HandComputedValues) {
  Tensor x = tensor({1, 2, 3}, DType::f64);
  expect_close(ops::softmax(x, 0), tensor({0.09003057317038046, 0.24472847105479767, 0.6652409557748219}, DType::f64),
               1e-12);
  // logsumexp(1, 2, 3) = 3.40760596444438
  expect_close(ops::log_softmax(x, -1), tensor({-2.40760596444438, -1.40760596444438, -0.40760596444438}, DType::f64),
               1e-12);
  expect_close(ops::softmax(tensor({0, 0}), 0), tensor({0.5, 0.5}));
  expect_close(ops::softmax(scalar_tensor(7), 0), scalar_tensor(1));
  expect_close(ops::log_softmax(scalar_tensor(7), -1), scalar_tensor(0));
}

TEST(Softmax, RowsSumToOneAlongEveryDim) {
  for (const Shape& shape : {Shape{3, 5}, Shape{2, 3, 7}}) {
    Tensor x = random_f64(shape, 50, -4, 4).to(DType::f32);
    for (int64_t dim = -static_cast<int64_t>(shape.size()); dim < static_cast<int64_t>(shape.size()); ++dim) {
      Tensor y = ops::softmax(x, dim);
      EXPECT_EQ(y.dtype(), DType::f32);
      expect_close(ops::sum(y, {dim}), ones(ops::sum(y, {dim}).shape()), 1e-6);
      expect_close(y, reference_softmax(x, dim, false), 1e-6);
      expect_close(ops::log_softmax(x, dim), reference_softmax(x, dim, true), 1e-5);
    }
  }
}

TEST(Softmax, NonContiguousInputs) {
  Tensor x = random_f64({5, 4}, 51, -3, 3);
  Tensor xt = x.t();  // [4, 5], columns dense
  expect_close(ops::softmax(xt, 1), reference_softmax(xt, 1, false), 1e-12);
  expect_close(ops::log_softmax(xt, 0), reference_softmax(xt, 0, true), 1e-12);
  Tensor sliced = x.slice(1, 0, 4, 2);  // [5, 2] with stride 2
  expect_close(ops::softmax(sliced, 1), reference_softmax(sliced, 1, false), 1e-12);
}

TEST(Softmax, LargeLogitsStayFinite) {
  Tensor x = tensor({1000, 1001});
  Tensor y = ops::softmax(x, 0), ly = ops::log_softmax(x, 0);
  expect_close(y, tensor({0.2689414213699951, 0.7310585786300049}), 1e-6);
  expect_close(ly, tensor({-1.3132616875182228, -0.3132616875182228}), 1e-5);
  expect_close(ops::softmax(tensor({-1000, -1001}), 0), tensor({0.7310585786300049, 0.2689414213699951}), 1e-6);
  // -inf (a masked position) gets probability 0.
  const double inf = std::numeric_limits<double>::infinity();
  expect_close(ops::softmax(tensor({0, -inf, 0}), 0), tensor({0.5, 0, 0.5}));
  EXPECT_EQ(ops::log_softmax(tensor({0, -inf}), 0).to_vector<double>()[1], -inf);
}

TEST(Softmax, HalfDtypesComputeInFloatAndRound) {
  Tensor x = random_f64({4, 9}, 52, -5, 5);
  for (DType dtype : {DType::f16, DType::bf16}) {
    Tensor xh = x.to(dtype);
    Tensor y = ops::softmax(xh, -1), ly = ops::log_softmax(xh, 0);
    EXPECT_EQ(y.dtype(), dtype);
    EXPECT_EQ(ly.dtype(), dtype);
    expect_close(y, reference_softmax(xh, -1, false), 1e-3, 1e-2);
    expect_close(ly, reference_softmax(xh, 0, true), 1e-2, 1e-2);
  }
}

TEST(Softmax, ManyRowsInParallelMatchOneRowAtATime) {
  // 300 x 257 values: above the parallel grain, along the last dim and along dim 0.
  Tensor x = random_f64({300, 257}, 53, -10, 10);
  Tensor y = ops::softmax(x, -1);
  for (int64_t r : {0, 151, 299}) expect_close(y.select(0, r), ops::softmax(x.select(0, r), 0), 0, 0);
  Tensor y0 = ops::log_softmax(x, 0);
  for (int64_t c : {0, 128, 256}) expect_close(y0.select(1, c), ops::log_softmax(x.select(1, c), 0), 0, 0);
  // Backward on the parallel path against the closed forms, per row.
  Tensor xr = x.detach().set_requires_grad();
  Tensor g = random_f64({300, 257}, 54);
  ops::sum(ops::softmax(xr, 1) * g).backward();
  for (int64_t r : {0, 299}) {
    Tensor yr = ops::softmax(x.select(0, r), 0), gr = g.select(0, r);
    Tensor expected = yr * (gr - ops::sum(gr * yr));
    expect_close(xr.grad().select(0, r), expected, 1e-12);
  }
}

TEST(Softmax, Errors) {
  expect_error([] { ops::softmax(arange(0, 3), 0); }, "softmax: input must be a floating tensor, got int64[3] on cpu");
  expect_error(
      [] {
        ops::log_softmax(zeros({2, 3}), 2);
      },
      "log_softmax: dim 2 is out of range for a tensor of 2 dims (expected a dim in [-2, 1])");
  expect_error([] { ops::softmax(Tensor(), 0); }, "softmax: input is an undefined tensor");
}

TEST(Softmax, GradientsMatchFiniteDifferences) {
  for (const Shape& shape : {Shape{3, 5}, Shape{2, 3, 7}, Shape{6}}) {
    Tensor x = random_f64(shape, 55, -2, 2);
    for (int64_t dim = -static_cast<int64_t>(shape.size()); dim < static_cast<int64_t>(shape.size()); ++dim) {
      expect_gradients_match([&](const std::vector<Tensor>& in) { return ops::softmax(in[0], dim); }, {x});
      expect_gradients_match([&](const std::vector<Tensor>& in) { return ops::log_softmax(in[0], dim); }, {x});
    }
  }
  Tensor t = random_f64({5, 3}, 56).t();
  expect_gradients_match([](const std::vector<Tensor>& in) { return ops::softmax(in[0], 1); }, {t});
}
