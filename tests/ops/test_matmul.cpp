#include <gtest/gtest.h>

#include "ops/ops.h"
#include "support/gradcheck.h"

using namespace precis;
using precis::testing::expect_close;
using precis::testing::expect_gradients_match;
using precis::testing::random_f64;

namespace {
// The textbook triple loop, as an independent reference for [M, K] x [K, N].
Tensor reference_matmul(const Tensor& a, const Tensor& b) {
  auto av = a.contiguous().to_vector<double>(), bv = b.contiguous().to_vector<double>();
  int64_t M = a.size(0), K = a.size(1), N = b.size(1);
  std::vector<double> c(M * N, 0.0);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t k = 0; k < K; ++k)
      for (int64_t j = 0; j < N; ++j) c[i * N + j] += av[i * K + k] * bv[k * N + j];
  return from_vector(c, {M, N});
}
}  // namespace

TEST(Matmul, HandComputed) {
  Tensor a = tensor({1, 2, 3, 4, 5, 6}).reshape({2, 3});
  Tensor b = tensor({1, 0, 0, 1, 1, 1}).reshape({3, 2});
  expect_close(ops::matmul(a, b), tensor({4, 5, 10, 11}).reshape({2, 2}));
  expect_close(ops::matmul(tensor({1, 2, 3}), b), tensor({4, 5}));   // vector @ matrix
  expect_close(ops::matmul(a, tensor({1, 1, 1})), tensor({6, 15}));  // matrix @ vector
}

TEST(Matmul, AgreesWithReferenceOnOddShapesAndTransposedOperands) {
  for (auto [M, K, N] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{{1, 1, 1}, {7, 13, 5}, {33, 17, 65}}) {
    Tensor a = random_f64({M, K}, 1), b = random_f64({K, N}, 2);
    Tensor ref = reference_matmul(a, b);
    expect_close(ops::matmul(a, b), ref, 1e-12, 1e-12);
    Tensor at = random_f64({K, M}, 1).t().contiguous();
    expect_close(ops::matmul(a.t().contiguous().t(), b.t().contiguous().t()), ref, 1e-12, 1e-12);
    expect_close(ops::matmul(at, b), reference_matmul(at, b), 1e-12, 1e-12);
    expect_close(ops::matmul(a.to(DType::f32), b.to(DType::f32)), ref, 1e-5, 1e-5);
  }
}

TEST(Matmul, BatchedWithBroadcastBatchDims) {
  Tensor a = random_f64({2, 3, 4, 5}, 3), b = random_f64({3, 5, 6}, 4);
  Tensor c = ops::matmul(a, b);
  ASSERT_EQ(c.shape(), Shape({2, 3, 4, 6}));
  for (int64_t i = 0; i < 2; ++i)
    for (int64_t j = 0; j < 3; ++j)
      expect_close(c.select(0, i).select(0, j), reference_matmul(a.select(0, i).select(0, j), b.select(0, j)), 1e-12,
                   1e-12);
}

TEST(Matmul, HalfInputsAreComputedInFloatAndRounded) {
  Tensor a = random_f64({8, 16}, 5).to(DType::bf16), b = random_f64({16, 4}, 6).to(DType::bf16);
  Tensor c = ops::matmul(a, b);
  EXPECT_EQ(c.dtype(), DType::bf16);
  Tensor exact = reference_matmul(a.to(DType::f64), b.to(DType::f64));
  expect_close(c, exact.to(DType::bf16), 0, 0);  // f32 accumulation then one rounding
}

TEST(Matmul, GradientsMatchFiniteDifferences) {
  expect_gradients_match([](const std::vector<Tensor>& in) { return ops::matmul(in[0], in[1]); },
                         {random_f64({3, 5}, 7), random_f64({5, 2}, 8)});
  expect_gradients_match([](const std::vector<Tensor>& in) { return ops::matmul(in[0], in[1].transpose(-1, -2)); },
                         {random_f64({2, 3, 5}, 9), random_f64({4, 5}, 10)});
  expect_gradients_match([](const std::vector<Tensor>& in) { return ops::matmul(in[0], in[1]); },
                         {random_f64({5}, 11), random_f64({2, 5, 3}, 12)});
  expect_gradients_match([](const std::vector<Tensor>& in) { return ops::linear(in[0], in[1], in[2]); },
                         {random_f64({2, 3, 5}, 13), random_f64({4, 5}, 14), random_f64({4}, 15)});
}

TEST(Matmul, ShapeErrorsNameTheShapes) {
  try {
    ops::matmul(zeros({2, 3}), zeros({4, 5}));
    FAIL();
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "matmul: shapes [2, 3] and [4, 5] do not fit (inner dims 3 and 4 differ)");
  }
  EXPECT_THROW(ops::matmul(arange(0, 4).reshape({2, 2}), zeros({2, 2})), Error);
  EXPECT_THROW(ops::linear(zeros({2, 3}), zeros({4, 5})), Error);
}
