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

const double kNan = std::numeric_limits<double>::quiet_NaN();

}  // namespace

// ---------------------------------------------------------------- sum, mean, sum_to_shape

TEST(Sum, HandComputedValuesOverDims) {
  Tensor x = tensor({1, 2, 3, 4, 5, 6}).reshape({2, 3});
  expect_close(ops::sum(x), scalar_tensor(21));
  expect_close(ops::sum(x, {0}), tensor({5, 7, 9}));
  expect_close(ops::sum(x, {1}), tensor({6, 15}));
  expect_close(ops::sum(x, {-1}), tensor({6, 15}));
  expect_close(ops::sum(x, {-2}, true), tensor({5, 7, 9}).reshape({1, 3}));
  expect_close(ops::sum(x, {1}, true), tensor({6, 15}).reshape({2, 1}));
  expect_close(ops::sum(x, {0, 1}), scalar_tensor(21));
  expect_close(ops::sum(x, {}, true), tensor({21}).reshape({1, 1}));
}

TEST(Sum, SeveralDimsOfA3dTensor) {
  // x[i][j][k] = 100 i + 10 j + k, shape [2, 3, 4]
  std::vector<double> values;
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j)
      for (int k = 0; k < 4; ++k) values.push_back(100 * i + 10 * j + k);
  Tensor x = from_vector(values, {2, 3, 4});
  // over i and k: 4 (0 + 100) + 2 * 4 * 10 j + 2 (0 + 1 + 2 + 3)
  expect_close(ops::sum(x, {0, -1}), from_vector<double>({412, 492, 572}, {3}));
  expect_close(ops::sum(x, {2, 0}, true), from_vector<double>({412, 492, 572}, {1, 3, 1}));
  expect_close(ops::mean(x, {0, 2}), from_vector<double>({51.5, 61.5, 71.5}, {3}));
  expect_close(ops::mean(x), scalar_tensor(61.5, DType::f64));
  // The same on a transposed (non-contiguous) view.
  expect_close(ops::sum(x.transpose(0, 2), {1}), ops::sum(x, {1}).t());
}

TEST(Sum, DtypesOfTheResult) {
  EXPECT_EQ(ops::sum(arange(0, 5)).dtype(), DType::i64);
  EXPECT_EQ(ops::sum(arange(0, 5)).item<int64_t>(), 10);
  EXPECT_EQ(ops::sum(arange(0, 5).to(DType::i32)).dtype(), DType::i64);
  EXPECT_EQ(ops::sum(arange(0, 5).to(DType::i32), {0}).item<int64_t>(), 10);
  EXPECT_EQ(ops::sum(tensor({1, 0, 1}, DType::boolean)).item<int64_t>(), 2);
  Tensor h = tensor({1, 2, 3}, DType::f16);
  EXPECT_EQ(ops::sum(h).dtype(), DType::f16);
  EXPECT_EQ(ops::mean(h).item<double>(), 2.0);
  EXPECT_EQ(ops::mean(tensor({1, 2}, DType::bf16)).dtype(), DType::bf16);
}

TEST(Sum, SumToShapeUndoesBroadcasting) {
  Tensor x = tensor({1, 2, 3, 4, 5, 6}).reshape({2, 3});
  expect_close(ops::sum_to_shape(x, {3}), tensor({5, 7, 9}));
  expect_close(ops::sum_to_shape(x, {1, 3}), tensor({5, 7, 9}).reshape({1, 3}));
  expect_close(ops::sum_to_shape(x, {2, 1}), tensor({6, 15}).reshape({2, 1}));
  expect_close(ops::sum_to_shape(x, {}), scalar_tensor(21));
  EXPECT_TRUE(ops::sum_to_shape(x, {2, 3}).same(x));
  expect_error([&] { ops::sum_to_shape(x, {4}); }, "sum_to_shape: cannot reduce [2, 3] to [4]");
  expect_error([&] { ops::sum_to_shape(x, {1, 2, 3, 4}); }, "sum_to_shape: cannot reduce [2, 3] to [1, 2, 3, 4]");
}

// Sums over leading dims of a contiguous tensor add each column's values in double, row by
// row in order: the same bits as the loop below, and as the general path (a non-contiguous
// view of the same values, reduced through a transposed copy). Widths of one task, several
// tasks and a partial last one; sizes below and above the parallel threshold.
TEST(Sum, LeadingDimsAddEachColumnInOrderInDouble) {
  for (const Shape& shape : {Shape{3, 5}, Shape{16, 64, 128}, Shape{40, 700}, Shape{7, 3, 300}}) {
    const Tensor x = random_f64(shape, 22, -3, 3).to(DType::f32);
    const int64_t count = shape[0] * (shape.size() == 3 ? shape[1] : 1), width = x.numel() / count;
    const std::vector<int64_t> dims = shape.size() == 3 ? std::vector<int64_t>{0, 1} : std::vector<int64_t>{0};
    const std::vector<float> values = x.to_vector<float>();
    std::vector<float> expected(width);
    for (int64_t j = 0; j < width; ++j) {
      double acc = 0;
      for (int64_t i = 0; i < count; ++i) acc += values[i * width + j];
      expected[j] = static_cast<float>(acc);
    }
    const Tensor sums = ops::sum(x, dims).reshape({width});
    EXPECT_EQ(sums.to_vector<float>(), expected) << shape;
    const Tensor strided = x.reshape({count, width}).t().contiguous().t();  // same values, column-major
    ASSERT_FALSE(strided.is_contiguous());
    EXPECT_EQ(ops::sum(strided, {0}).to_vector<float>(), expected) << shape;
    EXPECT_EQ(ops::sum_to_shape(x, Shape{width}).to_vector<float>(), expected) << shape;
  }
}

TEST(Sum, Errors) {
  Tensor x = zeros({2, 3});
  expect_error([&] { ops::sum(x, {2}); },
               "sum: dim 2 is out of range for a tensor of 2 dims (expected a dim in [-2, 1])");
  expect_error([&] { ops::sum(x, {1, -1}); }, "sum: dim -1 appears twice in the reduction dims");
  expect_error([&] { ops::mean(zeros({0, 3}), {0}); }, "mean: reducing over zero elements (shape [0, 3])");
  expect_error([&] { ops::mean(arange(0, 3)); }, "mean: input must be a floating tensor, got int64[3] on cpu");
  expect_error([&] { ops::sum(Tensor()); }, "sum: input is an undefined tensor");
}

TEST(Sum, GradientsMatchFiniteDifferences) {
  for (const Shape& shape : {Shape{3, 5}, Shape{2, 3, 7}}) {
    Tensor x = random_f64(shape, 20);
    for (std::vector<int64_t> dims : {std::vector<int64_t>{0}, {-1}, {0, -1}, {}}) {
      for (bool keepdim : {false, true}) {
        expect_gradients_match([&](const std::vector<Tensor>& in) { return ops::sum(in[0], dims, keepdim); }, {x});
        expect_gradients_match([&](const std::vector<Tensor>& in) { return ops::mean(in[0], dims, keepdim); }, {x});
      }
    }
  }
  Tensor y = random_f64({4, 1, 3}, 21);
  expect_gradients_match([](const std::vector<Tensor>& in) { return ops::sum_to_shape(in[0], {1, 3}); }, {y});
}

// ---------------------------------------------------------------- max, amax

TEST(Max, ValuesAndIndicesAlongADim) {
  Tensor x = tensor({1, 5, 3, 7, 2, 7}).reshape({2, 3});
  auto [values, indices] = ops::max(x, 1);
  expect_close(values, tensor({5, 7}));
  EXPECT_EQ(indices.dtype(), DType::i64);
  EXPECT_EQ(indices.to_vector<int64_t>(), (std::vector<int64_t>{1, 0}));  // the first of the tied 7s
  auto [v0, i0] = ops::max(x, -2, true);
  EXPECT_EQ(v0.shape(), (Shape{1, 3}));
  expect_close(v0, tensor({7, 5, 7}).reshape({1, 3}));
  EXPECT_EQ(i0.to_vector<int64_t>(), (std::vector<int64_t>{1, 0, 1}));
  // A transposed view reads the same values.
  auto [vt, it] = ops::max(x.t(), 0);
  expect_close(vt, tensor({5, 7}));
  EXPECT_EQ(it.to_vector<int64_t>(), (std::vector<int64_t>{1, 0}));
}

TEST(Max, FullReductionAndAmaxOverSeveralDims) {
  // x[i][j][k] = (7 i + 3 j + 5 k) mod 11 on [2, 3, 4]
  std::vector<double> values;
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j)
      for (int k = 0; k < 4; ++k) values.push_back((7 * i + 3 * j + 5 * k) % 11);
  Tensor x = from_vector(values, {2, 3, 4});
  EXPECT_EQ(ops::max(x).shape(), Shape{});
  EXPECT_EQ(ops::max(x).item(), 10.0);
  // amax over i and k, computed by hand from the formula.
  std::vector<double> expected(3, -1);
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j)
      for (int k = 0; k < 4; ++k) expected[j] = std::max<double>(expected[j], (7 * i + 3 * j + 5 * k) % 11);
  expect_close(ops::amax(x, {0, -1}), from_vector(expected, {3}));
  expect_close(ops::amax(x, {2, 0}, true), from_vector(expected, {1, 3, 1}));
  expect_close(ops::amax(x, {}), scalar_tensor(10, DType::f64));
}

TEST(Max, GradientGoesToTheFirstMaximumAlongADim) {
  Tensor x = tensor({1, 5, 5, 2}, DType::f64).reshape({1, 4}).set_requires_grad();
  ops::max(x, 1).first.backward(tensor({3}, DType::f64));
  expect_close(x.grad(), tensor({0, 3, 0, 0}, DType::f64).reshape({1, 4}));
}

TEST(Max, TiesShareTheGradientInAmaxAndFullMax) {
  Tensor x = tensor({1, 3, 3, 2, 3, 0}, DType::f64).reshape({2, 3}).set_requires_grad();
  ops::max(x).backward();
  expect_close(x.grad(), tensor({0, 1.0 / 3, 1.0 / 3, 0, 1.0 / 3, 0}, DType::f64).reshape({2, 3}));
  Tensor y = x.detach().set_requires_grad();
  ops::sum(ops::amax(y, {1})).backward();
  expect_close(y.grad(), tensor({0, 0.5, 0.5, 0, 1, 0}, DType::f64).reshape({2, 3}));
}

TEST(Max, NanPropagatesAsInPyTorch) {
  Tensor x = tensor({1, kNan, 3, kNan}, DType::f64);
  auto [value, index] = ops::max(x, 0);
  EXPECT_TRUE(std::isnan(value.item()));
  EXPECT_EQ(index.item<int64_t>(), 1);
  EXPECT_TRUE(std::isnan(ops::amax(x, {0}).item()));
}

TEST(Max, IntegerAndHalfDtypes) {
  Tensor i = tensor({3, 9, 2}, DType::i64);
  EXPECT_EQ(ops::max(i).dtype(), DType::i64);
  EXPECT_EQ(ops::max(i).item<int64_t>(), 9);
  EXPECT_EQ(ops::max(i.to(DType::i32), 0).first.dtype(), DType::i32);
  for (DType dtype : {DType::f16, DType::bf16}) {
    Tensor h = tensor({0.5, -2, 1.5}, dtype);
    EXPECT_EQ(ops::max(h, 0).first.dtype(), dtype);
    EXPECT_EQ(ops::max(h, 0).first.item(), 1.5);
    EXPECT_EQ(ops::amax(h, {0}, true).dtype(), dtype);
  }
}

TEST(Max, LongRowsSplitIntoPiecesFindTheFirstMaximum) {
  // Rows longer than the parallel grain are reduced in pieces; the maximum sits in a later piece
  // and occurs twice, so the index must be the first occurrence across pieces.
  const int64_t n = 100000;
  std::vector<float> values(3 * n);
  for (int64_t r = 0; r < 3; ++r)
    for (int64_t i = 0; i < n; ++i) values[r * n + i] = -static_cast<float>(std::abs(i - (70000 - r)));
  for (int64_t r = 0; r < 3; ++r) values[r * n + 90000] = 0;
  Tensor x = from_vector(values, {3, n});
  auto [v, idx] = ops::max(x, 1);
  expect_close(v, zeros({3}));
  EXPECT_EQ(idx.to_vector<int64_t>(), (std::vector<int64_t>{70000, 69999, 69998}));
  EXPECT_EQ(ops::max(x).item(), 0.0);
  auto [vc, ic] = ops::max(x.t().contiguous(), 0);
  EXPECT_EQ(ic.to_vector<int64_t>(), (std::vector<int64_t>{70000, 69999, 69998}));
  // Two ties per row share the gradient of amax.
  Tensor y = x.to(DType::f64).set_requires_grad();
  ops::sum(ops::amax(y, {1})).backward();
  std::vector<double> grad = y.grad().to_vector<double>();
  EXPECT_EQ(grad[70000], 0.5);
  EXPECT_EQ(grad[90000], 0.5);
  EXPECT_EQ(grad[2 * n + 69998], 0.5);
  EXPECT_EQ(ops::sum(y.grad()).item(), 3.0);
}

TEST(Max, Errors) {
  expect_error(
      [] {
        ops::max(zeros({2, 0}), 1);
      },
      "max: cannot take the max over dim 1 of size 0 (input float32[2, 0] on cpu)");
  expect_error([] { ops::max(zeros({0})); }, "max: cannot reduce over zero elements (input float32[0] on cpu");
  expect_error([] { ops::amax(zeros({2, 3}), {3}); }, "amax: dim 3 is out of range for a tensor of 2 dims");
  expect_error([] { ops::max(zeros({2}, DType::boolean)); },
               "max: input must be a floating or integer (int32, int64) tensor, got bool[2] on cpu");
  expect_error([] { ops::max(Tensor()); }, "max: input is an undefined tensor");
}

TEST(Max, GradientsMatchFiniteDifferences) {
  for (const Shape& shape : {Shape{3, 5}, Shape{2, 3, 7}}) {
    Tensor x = random_f64(shape, 30);
    for (int64_t dim : {0, 1, -1}) {
      for (bool keepdim : {false, true}) {
        expect_gradients_match([&](const std::vector<Tensor>& in) { return ops::max(in[0], dim, keepdim).first; }, {x});
      }
    }
    for (std::vector<int64_t> dims : {std::vector<int64_t>{0}, {-1}, {0, -1}, {}}) {
      expect_gradients_match([&](const std::vector<Tensor>& in) { return ops::amax(in[0], dims, true); }, {x});
    }
    expect_gradients_match([](const std::vector<Tensor>& in) { return ops::max(in[0]); }, {x});
  }
  Tensor s = random_f64({}, 31);
  expect_gradients_match([](const std::vector<Tensor>& in) { return ops::max(in[0], 0).first; }, {s});
}

// ---------------------------------------------------------------- var

TEST(Var, HandComputedValues) {
  Tensor x = tensor({1, 2, 3, 4}, DType::f64);
  // mean 2.5, squared deviations sum to 5
  EXPECT_NEAR(ops::var(x, {}).item(), 5.0 / 3, 1e-12);
  EXPECT_NEAR(ops::var(x, {0}, 0).item(), 5.0 / 4, 1e-12);
  EXPECT_NEAR(ops::var(x, {0}, 2).item(), 5.0 / 2, 1e-12);
  Tensor m = tensor({1, 2, 3, 4, 6, 8}, DType::f64).reshape({2, 3});
  expect_close(ops::var(m, {1}), tensor({1, 4}, DType::f64));
  expect_close(ops::var(m, {-2}, 1, true), tensor({4.5, 8, 12.5}, DType::f64).reshape({1, 3}));
  expect_close(ops::var(m.t(), {0}), tensor({1, 4}, DType::f64));
  EXPECT_NEAR(ops::var(m, {0, 1}, 0).item(), ops::var(m, {}, 0).item(), 1e-12);
}

TEST(Var, TooFewValuesForTheCorrectionGiveNanOrInfAsTorch) {
  EXPECT_TRUE(std::isnan(ops::var(tensor({3}), {0}).item()));
  EXPECT_TRUE(std::isinf(ops::var(tensor({1, 3}), {0}, 3).item()));
}

TEST(Var, HalfDtypesAndLongRows) {
  for (DType dtype : {DType::f16, DType::bf16}) {
    Tensor v = ops::var(tensor({1, 2, 3, 4}, dtype), {0});
    EXPECT_EQ(v.dtype(), dtype);
    EXPECT_NEAR(v.item(), 5.0 / 3, 1e-2);
  }
  // A row split into pieces, with a large offset that a naive sum of squares would lose.
  const int64_t n = 200001;
  std::vector<double> values(n);
  for (int64_t i = 0; i < n; ++i) values[i] = 1e6 + static_cast<double>(i % 7);
  double mean = 0, squares = 0;
  for (double v : values) mean += v;
  mean /= n;
  for (double v : values) squares += (v - mean) * (v - mean);
  Tensor x = from_vector(values, {n});
  EXPECT_NEAR(ops::var(x, {0}).item(), squares / (n - 1), 1e-9);
  EXPECT_NEAR(ops::var(x.to(DType::f32), {}).item(), squares / (n - 1), 1e-3);
}

TEST(Var, Errors) {
  expect_error([] { ops::var(arange(0, 3), {0}); }, "var: input must be a floating tensor, got int64[3] on cpu");
  expect_error([] { ops::var(zeros({2, 3}), {-3}); }, "var: dim -3 is out of range for a tensor of 2 dims");
}

TEST(Var, GradientsMatchFiniteDifferences) {
  for (const Shape& shape : {Shape{3, 5}, Shape{2, 3, 7}}) {
    Tensor x = random_f64(shape, 40);
    for (std::vector<int64_t> dims : {std::vector<int64_t>{0}, {-1}, {0, -1}, {}}) {
      for (int64_t correction : {0, 1}) {
        expect_gradients_match(
            [&](const std::vector<Tensor>& in) { return ops::var(in[0], dims, correction, correction == 1); }, {x});
      }
    }
  }
  Tensor t = random_f64({5, 3}, 41).t();
  expect_gradients_match([](const std::vector<Tensor>& in) { return ops::var(in[0], {1}); }, {t});
}
