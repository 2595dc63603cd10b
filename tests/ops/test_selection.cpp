#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "ops/ops.h"
#include "support/errors.h"
#include "support/gradcheck.h"

using namespace precis;
using precis::testing::error_of;
using precis::testing::expect_close;
using precis::testing::expect_gradients_match;
using precis::testing::random_f64;

namespace {

Tensor bools(const std::vector<uint8_t>& values, const Shape& shape) {
  return from_vector(values, shape).to(DType::boolean);
}

// A bool tensor of `shape`, true with probability 1/2, from a seed.
Tensor random_bools(const Shape& shape, uint64_t seed) {
  std::vector<double> u = random_f64(shape, seed, 0.0, 1.0).to_vector<double>();
  std::vector<uint8_t> values(u.size());
  for (size_t i = 0; i < u.size(); ++i) values[i] = u[i] < 0.5;
  return bools(values, shape);
}

}  // namespace

TEST(Where, HandComputedValuesWithBroadcasting) {
  Tensor cond = bools({1, 0, 1, 0, 0, 1}, {2, 3});
  Tensor a = tensor({1, 2, 3});
  Tensor b = tensor({-1, -2}).reshape({2, 1});
  expect_close(ops::where(cond, a, b), tensor({1, -1, 3, -2, -2, 3}).reshape({2, 3}), 0, 0);
  // The condition broadcasts too, and a uint8 condition counts any nonzero byte as true.
  Tensor bytes = from_vector(std::vector<uint8_t>{0, 2, 255}, {3});
  expect_close(ops::where(bytes, ones({2, 3}), zeros({2, 3})), tensor({0, 1, 1, 0, 1, 1}).reshape({2, 3}), 0, 0);
}

TEST(Where, DtypesPromoteAndHalfStaysHalf) {
  Tensor cond = bools({1, 0}, {2});
  Tensor out = ops::where(cond, tensor({1.5, 2.5}, DType::f32), tensor({1.0 / 3, 0.25}, DType::f64));
  EXPECT_EQ(out.dtype(), DType::f64);
  EXPECT_EQ(out.to_vector<double>(), (std::vector<double>{1.5, 0.25}));
  Tensor half = ops::where(cond, tensor({1.5, 2.5}, DType::f16), tensor({0.1, 0.2}, DType::f16));
  EXPECT_EQ(half.dtype(), DType::f16);
  EXPECT_EQ(half.to_vector<double>(), (std::vector<double>{1.5, tensor({0.2}, DType::f16).item()}));
  EXPECT_EQ(ops::where(cond, tensor({1}, DType::f16), tensor({2}, DType::bf16)).dtype(), DType::f32);
}

TEST(Where, GradientsMatchFiniteDifferences) {
  struct Case {
    Shape cond, a, b;
  };
  uint64_t seed = 30;
  for (const Case& c : std::vector<Case>{{{3, 5}, {3, 5}, {3, 5}},
                                         {{2, 3, 7}, {3, 7}, {2, 1, 7}},
                                         {{3, 1}, {3, 5}, {5}},
                                         {{5}, {1}, {2, 3, 5}},
                                         {{}, {4, 3}, {}}}) {
    SCOPED_TRACE(::testing::Message() << "cond " << c.cond << ", a " << c.a << ", b " << c.b);
    Tensor cond = random_bools(c.cond, ++seed);
    Tensor a = random_f64(c.a, ++seed), b = random_f64(c.b, ++seed);
    expect_gradients_match([cond](const std::vector<Tensor>& in) { return ops::where(cond, in[0], in[1]); }, {a, b});
  }
}

TEST(Where, GradientGoesToTheSelectedSide) {
  Tensor cond = bools({1, 0, 1, 1}, {2, 2});
  Tensor a = zeros({2, 2}, DType::f64).set_requires_grad();
  Tensor b = zeros({2}, DType::f64).set_requires_grad();  // broadcast over rows
  ops::where(cond, a, b).backward(tensor({1, 2, 3, 4}, DType::f64).reshape({2, 2}));
  EXPECT_EQ(a.grad().to_vector<double>(), (std::vector<double>{1, 0, 3, 4}));
  EXPECT_EQ(b.grad().to_vector<double>(), (std::vector<double>{0, 2}));
  // Mixed dtypes: each gradient comes back in its input's dtype.
  Tensor h = zeros({2}, DType::f16).set_requires_grad();
  Tensor f = zeros({2}, DType::f32).set_requires_grad();
  ops::sum(ops::where(bools({1, 0}, {2}), h, f)).backward();
  EXPECT_EQ(h.grad().dtype(), DType::f16);
  EXPECT_EQ(f.grad().dtype(), DType::f32);
  EXPECT_EQ(h.grad().to_vector<double>(), (std::vector<double>{1, 0}));
  EXPECT_EQ(f.grad().to_vector<double>(), (std::vector<double>{0, 1}));
}

TEST(Where, Errors) {
  Tensor x = zeros({2, 3});
  EXPECT_EQ(error_of([&] {
              ops::where(zeros({2, 3}), x, x);
            }),
            "where: the condition must be a bool or uint8 tensor, got float32[2, 3] on cpu");
  EXPECT_EQ(error_of([&] { ops::where(random_bools({4}, 1), x, x); }),
            "where: shapes [4] and [2, 3] cannot be broadcast together (dim 1: 4 vs 3)");
  EXPECT_EQ(error_of([&] { ops::where(random_bools({3}, 1), x, arange(0, 3)); }),
            "where: second operand must be a floating tensor, got int64[3] on cpu");
  EXPECT_EQ(error_of([&] { ops::where(Tensor(), x, x); }), "where: condition is an undefined tensor");
}

TEST(MaskedFill, HandComputedValues) {
  Tensor x = tensor({1, 2, 3, 4, 5, 6}).reshape({2, 3});
  expect_close(ops::masked_fill(x, bools({0, 1, 0}, {3}), -7.5), tensor({1, -7.5, 3, 4, -7.5, 6}).reshape({2, 3}), 0,
               0);
  Tensor filled = ops::masked_fill(x, bools({1, 0}, {2, 1}), -INFINITY);
  expect_close(filled, tensor({-INFINITY, -INFINITY, -INFINITY, 4, 5, 6}).reshape({2, 3}), 0, 0);
  // The value is rounded to the input's dtype.
  Tensor half = ops::masked_fill(tensor({1, 2}, DType::bf16), bools({1, 0}, {2}), 0.1);
  EXPECT_EQ(half.dtype(), DType::bf16);
  EXPECT_EQ(half.to_vector<double>(), (std::vector<double>{tensor({0.1}, DType::bf16).item(), 2}));
}

TEST(MaskedFill, GradientsMatchFiniteDifferencesAndAreZeroWhereFilled) {
  uint64_t seed = 40;
  for (auto shapes : std::vector<std::pair<Shape, Shape>>{{{3, 5}, {3, 5}}, {{3, 5}, {5}}, {{2, 3, 7}, {3, 1}}}) {
    SCOPED_TRACE(::testing::Message() << "x " << shapes.first << ", mask " << shapes.second);
    Tensor mask = random_bools(shapes.second, ++seed);
    expect_gradients_match([mask](const std::vector<Tensor>& in) { return ops::masked_fill(in[0], mask, 2.0); },
                           {random_f64(shapes.first, ++seed)});
  }
  Tensor x = zeros({2, 2}, DType::f64).set_requires_grad();
  ops::masked_fill(x, bools({0, 1}, {2}), 9.0).backward(tensor({1, 2, 3, 4}, DType::f64).reshape({2, 2}));
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{1, 0, 3, 0}));
}

TEST(MaskedFill, Errors) {
  Tensor x = zeros({2, 3});
  EXPECT_EQ(error_of([&] { ops::masked_fill(x, zeros({3}), 0.0); }),
            "masked_fill: mask must be a bool tensor, got float32[3] on cpu");
  EXPECT_EQ(error_of([&] {
              ops::masked_fill(x, random_bools({4, 2, 3}, 1), 0.0);
            }),
            "masked_fill: mask of shape [4, 2, 3] does not broadcast to the input's shape [2, 3]");
  EXPECT_EQ(error_of([&] { ops::masked_fill(x, random_bools({2}, 1), 0.0); }),
            "masked_fill: shapes [2, 3] and [2] cannot be broadcast together (dim 1: 3 vs 2)");
  EXPECT_EQ(error_of([&] { ops::masked_fill(arange(0, 3), random_bools({3}, 1), 0.0); }),
            "masked_fill: input must be a floating tensor, got int64[3] on cpu");
}

TEST(CausalMask, HidesKeysAfterTheQuery) {
  Tensor mask = ops::causal_mask(4);
  EXPECT_EQ(mask.dtype(), DType::boolean);
  EXPECT_EQ(mask.shape(), (Shape{4, 4}));
  EXPECT_EQ(mask.to_vector<bool>(), (std::vector<bool>{0, 1, 1, 1,  //
                                                       0, 0, 1, 1,  //
                                                       0, 0, 0, 1,  //
                                                       0, 0, 0, 0}));
  EXPECT_EQ(ops::causal_mask(0).shape(), (Shape{0, 0}));
  // Large enough for the threaded loop: row i hides exactly the T - 1 - i keys after it.
  const int64_t T = 301;
  std::vector<bool> big = ops::causal_mask(T).to_vector<bool>();
  for (int64_t i = 0; i < T; ++i)
    for (int64_t j = 0; j < T; ++j) ASSERT_EQ(big[i * T + j], j > i) << "query " << i << ", key " << j;
  // As attention uses it: masked scores become -inf, so softmax gives them zero weight.
  Tensor scores = ops::masked_fill(ones({2, 3, 3}), ops::causal_mask(3), -INFINITY);
  std::vector<double> s = scores.to_vector<double>();
  EXPECT_EQ(s[1], -INFINITY);
  EXPECT_EQ(s[9 + 3], 1.0);
  EXPECT_EQ(error_of([] { ops::causal_mask(-1); }), "causal_mask: T must be non-negative, got -1");
}
