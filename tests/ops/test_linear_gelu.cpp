// linear_gelu on the CPU (the composition gelu(linear(x, W, b))), against the
// tanh formula and central differences; and the TF32 switch's default.
#include <gtest/gtest.h>

#include <cmath>

#include "ops/ops.h"
#include "support/gradcheck.h"

using namespace precis;
using precis::testing::expect_close;
using precis::testing::expect_gradients_match;
using precis::testing::random_f64;

namespace {

// gelu(x W^T + b) by loops, in double, for x: [N, in].
Tensor reference_linear_gelu(const Tensor& x, const Tensor& w, const Tensor& b) {
  auto xv = x.contiguous().to_vector<double>(), wv = w.contiguous().to_vector<double>();
  std::vector<double> bv = b.defined() ? b.to_vector<double>() : std::vector<double>(w.size(0), 0.0);
  const int64_t N = x.size(0), in = x.size(1), out = w.size(0);
  std::vector<double> y(N * out);
  for (int64_t i = 0; i < N; ++i) {
    for (int64_t o = 0; o < out; ++o) {
      double z = bv[o];
      for (int64_t k = 0; k < in; ++k) z += xv[i * in + k] * wv[o * in + k];
      y[i * out + o] = 0.5 * z * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (z + 0.044715 * z * z * z)));
    }
  }
  return from_vector(y, {N, out});
}

}  // namespace

TEST(LinearGelu, ForwardIsGeluOfLinear) {
  Tensor x = random_f64({2, 3, 5}, 1, -3, 3), w = random_f64({4, 5}, 2), b = random_f64({4}, 3);
  Tensor y = ops::linear_gelu(x, w, b);
  ASSERT_EQ(y.shape(), Shape({2, 3, 4}));
  expect_close(y, ops::gelu(ops::linear(x, w, b)), 0, 0);
  expect_close(y.reshape({6, 4}), reference_linear_gelu(x.reshape({6, 5}), w, b), 1e-12, 1e-12);
}

TEST(LinearGelu, OddSizesWithoutBiasAndVectorInput) {
  for (auto [N, in, out] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{{1, 1, 1}, {7, 13, 5}, {33, 17, 65}}) {
    Tensor x = random_f64({N, in}, 4, -2, 2), w = random_f64({out, in}, 5), b = random_f64({out}, 6);
    expect_close(ops::linear_gelu(x, w, b), reference_linear_gelu(x, w, b), 1e-12, 1e-12);
    expect_close(ops::linear_gelu(x, w), reference_linear_gelu(x, w, Tensor()), 1e-12, 1e-12);
  }
  Tensor v = random_f64({5}, 7), w = random_f64({3, 5}, 8), b = random_f64({3}, 9);
  Tensor y = ops::linear_gelu(v, w, b);
  ASSERT_EQ(y.shape(), Shape({3}));
  expect_close(y, reference_linear_gelu(v.reshape({1, 5}), w, b).reshape({3}), 1e-12, 1e-12);
}

TEST(LinearGelu, FloatAndHalfFollowTheComposition) {
  Tensor x = random_f64({6, 9}, 10), w = random_f64({7, 9}, 11), b = random_f64({7}, 12);
  for (DType dtype : {DType::f32, DType::bf16}) {
    Tensor xd = x.to(dtype), wd = w.to(dtype), bd = b.to(dtype);
    Tensor y = ops::linear_gelu(xd, wd, bd);
    EXPECT_EQ(y.dtype(), dtype);
    expect_close(y, ops::gelu(ops::linear(xd, wd, bd)), 0, 0);
  }
}

TEST(LinearGelu, GradientsMatchFiniteDifferences) {
  auto fn = [](const std::vector<Tensor>& in) { return ops::linear_gelu(in[0], in[1], in[2]); };
  expect_gradients_match(fn, {random_f64({2, 3, 5}, 13, -2, 2), random_f64({4, 5}, 14), random_f64({4}, 15)});
  expect_gradients_match(fn, {random_f64({7, 13}, 16, -2, 2), random_f64({5, 13}, 17), random_f64({5}, 18)});
  expect_gradients_match(fn, {random_f64({1, 1}, 19, -2, 2), random_f64({1, 1}, 20), random_f64({1}, 21)});
  expect_gradients_match([](const std::vector<Tensor>& in) { return ops::linear_gelu(in[0], in[1]); },
                         {random_f64({3, 4}, 22, -2, 2), random_f64({6, 4}, 23)});
}

TEST(LinearGelu, ArgumentErrorsNameTheOp) {
  try {
    ops::linear_gelu(zeros({2, 3}), zeros({4, 5}));
    FAIL();
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "linear_gelu: input [2, 3] does not end in in_features = 5 (weight [4, 5])");
  }
  EXPECT_THROW(ops::linear_gelu(zeros({2, 3}), zeros({4, 3}), zeros({5})), Error);
  EXPECT_THROW(ops::linear_gelu(Tensor(), zeros({4, 3})), Error);
}

TEST(LinearGeluLinear, IsTheMlpComposition) {
  Tensor x = random_f64({2, 3, 5}, 24, -2, 2), w1 = random_f64({9, 5}, 25), b1 = random_f64({9}, 26);
  Tensor w2 = random_f64({4, 9}, 27), b2 = random_f64({4}, 28);
  Tensor y = ops::linear_gelu_linear(x, w1, b1, w2, b2);
  ASSERT_EQ(y.shape(), Shape({2, 3, 4}));
  Tensor hidden = reference_linear_gelu(x.reshape({6, 5}), w1, b1);
  expect_close(y.reshape({6, 4}), ops::matmul(hidden, w2.t()) + b2, 1e-12, 1e-12);
  expect_close(ops::linear_gelu_linear(x, w1, Tensor(), w2), ops::linear(ops::linear_gelu(x, w1), w2), 0, 0);
}

TEST(LinearGeluLinear, GradientsMatchFiniteDifferences) {
  auto fn = [](const std::vector<Tensor>& in) { return ops::linear_gelu_linear(in[0], in[1], in[2], in[3], in[4]); };
  expect_gradients_match(fn, {random_f64({2, 3, 5}, 29, -2, 2), random_f64({9, 5}, 30), random_f64({9}, 31),
                              random_f64({4, 9}, 32), random_f64({4}, 33)});
  expect_gradients_match(fn, {random_f64({7}, 34, -2, 2), random_f64({1, 7}, 35), random_f64({1}, 36),
                              random_f64({3, 1}, 37), random_f64({3}, 38)});
  expect_gradients_match(
      [](const std::vector<Tensor>& in) { return ops::linear_gelu_linear(in[0], in[1], Tensor(), in[2]); },
      {random_f64({4, 6}, 39, -2, 2), random_f64({5, 6}, 40), random_f64({2, 5}, 41)});
}

TEST(LinearGeluLinear, ArgumentErrorsNameTheOp) {
  try {
    ops::linear_gelu_linear(zeros({2, 3}), zeros({4, 3}), Tensor(), zeros({5, 3}));
    FAIL();
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(),
                 "linear_gelu_linear: second weight [5, 3] must be [out_features, 4] (in_features = the first weight's "
                 "out_features)");
  }
  EXPECT_THROW(ops::linear_gelu_linear(zeros({2, 3}), zeros({4, 3}), Tensor(), zeros({5, 4}), zeros({4})), Error);
  EXPECT_THROW(ops::linear_gelu_linear(zeros({2, 2}), zeros({4, 3}), Tensor(), zeros({5, 4})), Error);
  EXPECT_THROW(ops::linear_gelu_linear(zeros({2, 3}), zeros({4, 3}), Tensor(), Tensor()), Error);
}

TEST(MatmulSettings, Tf32IsOffUnlessSet) {
  EXPECT_FALSE(ops::allow_tf32());
  ops::set_allow_tf32(true);
  EXPECT_TRUE(ops::allow_tf32());
  ops::set_allow_tf32(false);
  EXPECT_FALSE(ops::allow_tf32());
}
