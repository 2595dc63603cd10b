#include <gtest/gtest.h>

#include "ops/ops.h"
#include "support/gradcheck.h"

using namespace precis;
using precis::testing::expect_close;
using precis::testing::expect_gradients_match;
using precis::testing::random_f64;

TEST(Binary, HandComputedValuesWithBroadcasting) {
  Tensor a = tensor({1, 2, 3, 4, 5, 6}).reshape({2, 3});
  Tensor b = tensor({10, 20, 30});
  expect_close(a + b, tensor({11, 22, 33, 14, 25, 36}).reshape({2, 3}));
  expect_close(a - b, tensor({-9, -18, -27, -6, -15, -24}).reshape({2, 3}));
  expect_close(a * b, tensor({10, 40, 90, 40, 100, 180}).reshape({2, 3}));
  expect_close(b / a, tensor({10, 10, 10, 2.5, 4, 5}).reshape({2, 3}));
  Tensor col = tensor({1, 2}).reshape({2, 1});
  expect_close(a * col, tensor({1, 2, 3, 8, 10, 12}).reshape({2, 3}));
}

TEST(Binary, ScalarVariants) {
  Tensor a = tensor({1, 2, 4});
  expect_close(a + 1.0, tensor({2, 3, 5}));
  expect_close(a - 1.0, tensor({0, 1, 3}));
  expect_close(1.0 - a, tensor({0, -1, -3}));
  expect_close(a * 2.0, tensor({2, 4, 8}));
  expect_close(a / 2.0, tensor({0.5, 1, 2}));
  expect_close(4.0 / a, tensor({4, 2, 1}));
  expect_close(-a, tensor({-1, -2, -4}));
}

TEST(Binary, DtypePromotionAndHalfRounding) {
  Tensor f = tensor({1.5}, DType::f32), d = tensor({2.25}, DType::f64), i = arange(1, 2);
  EXPECT_EQ((f + d).dtype(), DType::f64);
  EXPECT_EQ((f + i).dtype(), DType::f32);
  EXPECT_EQ((i + i).dtype(), DType::i64);
  EXPECT_EQ((i + i).item<int64_t>(), 2);
  // 1 + 2^-11 is not representable in f16: computed in f32, rounded to nearest even on store.
  Tensor h = tensor({1.0}, DType::f16);
  Tensor small = tensor({1.0 / 2048}, DType::f16);
  EXPECT_EQ((h + small).dtype(), DType::f16);
  EXPECT_EQ((h + small).item<double>(), 1.0);
  EXPECT_EQ((tensor({1.0}, DType::bf16) * 3.0).item<double>(), 3.0);
}

TEST(Binary, StridedAndTransposedOperands) {
  Tensor a = random_f64({4, 5}, 1);
  Tensor b = random_f64({5, 4}, 2);
  Tensor sum = a + b.t();
  auto av = a.to_vector<double>(), bv = b.to_vector<double>(), sv = sum.to_vector<double>();
  for (int r = 0; r < 4; ++r)
    for (int c = 0; c < 5; ++c) EXPECT_DOUBLE_EQ(sv[r * 5 + c], av[r * 5 + c] + bv[c * 4 + r]);
}

TEST(Binary, GradientsMatchFiniteDifferences) {
  for (auto shapes :
       std::vector<std::pair<Shape, Shape>>{{{3, 5}, {3, 5}}, {{2, 3, 7}, {7}}, {{4, 1}, {1, 3}}, {{1}, {2, 3}}}) {
    Tensor a = random_f64(shapes.first, 10, 0.5, 2.0), b = random_f64(shapes.second, 11, 0.5, 2.0);
    expect_gradients_match([](const std::vector<Tensor>& in) { return in[0] + in[1]; }, {a, b});
    expect_gradients_match([](const std::vector<Tensor>& in) { return in[0] - in[1]; }, {a, b});
    expect_gradients_match([](const std::vector<Tensor>& in) { return in[0] * in[1]; }, {a, b});
    expect_gradients_match([](const std::vector<Tensor>& in) { return in[0] / in[1]; }, {a, b});
  }
  Tensor x = random_f64({3, 4}, 12, 0.5, 2.0);
  expect_gradients_match([](const std::vector<Tensor>& in) { return 3.0 - in[0] * 2.0 + 1.0; }, {x});
  expect_gradients_match([](const std::vector<Tensor>& in) { return 2.0 / in[0] - in[0] / 4.0; }, {x});
}

TEST(Binary, ErrorsNameTheOpAndShapes) {
  Tensor a = zeros({2, 3}), b = zeros({4});
  try {
    a + b;
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "add: shapes [2, 3] and [4] cannot be broadcast together (dim 1: 3 vs 4)");
  }
  EXPECT_THROW(a * Tensor(), Error);
}
