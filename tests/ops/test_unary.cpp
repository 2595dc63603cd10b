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

using UnaryFn = Tensor (*)(const Tensor&);

struct NamedUnary {
  const char* name;
  UnaryFn fn;
  double low, high;  // a range of inputs where the op is smooth
};

Tensor pow3(const Tensor& x) { return ops::pow(x, 3.0); }

const std::vector<NamedUnary>& unary_ops() {
  static const std::vector<NamedUnary> list = {
      {"exp", ops::exp, -2.0, 2.0},    {"log", ops::log, 0.5, 2.0},    {"sqrt", ops::sqrt, 0.5, 2.0},
      {"rsqrt", ops::rsqrt, 0.5, 2.0}, {"tanh", ops::tanh, -2.0, 2.0}, {"sigmoid", ops::sigmoid, -3.0, 3.0},
      {"gelu", ops::gelu, -3.0, 3.0},  {"pow3", pow3, -2.0, 2.0},      {"neg", ops::neg, -1.0, 1.0},
  };
  return list;
}

// Uniform magnitudes in [0.1, 1) with alternating signs: no element is near relu's kink at 0.
Tensor away_from_zero(const Shape& shape, uint64_t seed) {
  std::vector<double> v = random_f64(shape, seed, 0.1, 1.0).to_vector<double>();
  for (size_t i = 0; i < v.size(); i += 2) v[i] = -v[i];
  return from_vector(v, shape);
}

}  // namespace

TEST(Unary, HandComputedValues) {
  const double tight = 1e-14;
  Tensor x = tensor({-3, -1, 0, 1, 2}, DType::f64);
  expect_close(
      ops::gelu(x),
      tensor({-0.0036373920817729943, -0.15880800939172324, 0, 0.8411919906082768, 1.954597694087775}, DType::f64),
      tight, tight);
  expect_close(
      ops::sigmoid(x),
      tensor({1 / (1 + std::exp(3.0)), 0.2689414213699951, 0.5, 0.7310585786300049, 0.8807970779778823}, DType::f64),
      tight, tight);
  expect_close(ops::tanh(tensor({-2, 0, 0.5}, DType::f64)),
               tensor({-0.9640275800758169, 0, 0.46211715726000974}, DType::f64), tight, tight);
  expect_close(ops::relu(x), tensor({0, 0, 0, 1, 2}, DType::f64), 0, 0);
  Tensor positive = tensor({0.25, 1, 4, M_E}, DType::f64);
  expect_close(ops::sqrt(positive), tensor({0.5, 1, 2, std::sqrt(M_E)}, DType::f64), tight, tight);
  expect_close(ops::rsqrt(positive), tensor({2, 1, 0.5, 1 / std::sqrt(M_E)}, DType::f64), tight, tight);
  expect_close(ops::log(positive), tensor({-std::log(4.0), 0, std::log(4.0), 1}, DType::f64), tight, tight);
  expect_close(ops::exp(tensor({0, 1}, DType::f64)), tensor({1, M_E}, DType::f64), tight, tight);
  expect_close(ops::pow(x, 2.0), tensor({9, 1, 0, 1, 4}, DType::f64), 0, 0);
  expect_close(ops::pow(x, 3.0), tensor({-27, -1, 0, 1, 8}, DType::f64), tight, tight);
  expect_close(ops::pow(positive, 0.5), ops::sqrt(positive), tight, tight);
  expect_close(ops::pow(positive, -1.0), tensor({4, 1, 0.25, 1 / M_E}, DType::f64), tight, tight);
  expect_close(ops::pow(x, 0.0), tensor({1, 1, 1, 1, 1}, DType::f64), 0, 0);
}

TEST(Unary, EdgeValues) {
  const double inf = INFINITY;
  // sigmoid saturates without NaN where exp(-x) overflows; relu keeps NaN, as PyTorch does.
  expect_close(ops::sigmoid(tensor({-1000, 1000}, DType::f32)), tensor({0, 1}, DType::f32), 0, 0);
  EXPECT_TRUE(std::isnan(ops::relu(tensor({NAN})).item()));
  expect_close(ops::log(tensor({0})), tensor({-inf}), 0, 0);
  expect_close(ops::rsqrt(tensor({0})), tensor({inf}), 0, 0);
  expect_close(ops::gelu(tensor({-100, 100})), tensor({0, 100}), 0, 0);
}

TEST(Unary, GradientsMatchFiniteDifferences) {
  uint64_t seed = 20;
  for (const Shape& shape : std::vector<Shape>{{3, 5}, {2, 3, 7}, {}}) {
    for (const NamedUnary& op : unary_ops()) {
      SCOPED_TRACE(::testing::Message() << op.name << " on shape " << shape);
      Tensor x = random_f64(shape, ++seed, op.low, op.high);
      expect_gradients_match([&op](const std::vector<Tensor>& in) { return op.fn(in[0]); }, {x});
    }
    Tensor positive = random_f64(shape, ++seed, 0.5, 2.0);
    for (double exponent : {2.0, 0.5, -1.5, 1.0, 0.0}) {
      SCOPED_TRACE(::testing::Message() << "pow " << exponent << " on shape " << shape);
      expect_gradients_match([exponent](const std::vector<Tensor>& in) { return ops::pow(in[0], exponent); },
                             {positive});
    }
    expect_gradients_match([](const std::vector<Tensor>& in) { return ops::relu(in[0]); },
                           {away_from_zero(shape, ++seed)});
  }
  // A chain through several saved tensors, on a transposed (strided) input.
  Tensor x = random_f64({5, 3}, 99, 0.5, 2.0);
  expect_gradients_match(
      [](const std::vector<Tensor>& in) {
        Tensor t = in[0].t();
        return ops::gelu(ops::tanh(ops::sqrt(t)) * ops::log(t)) + ops::sigmoid(ops::rsqrt(t));
      },
      {x});
}

TEST(Unary, ExactGradientsAtKnownPoints) {
  Tensor x = tensor({-1, 0.5, 2}, DType::f64).set_requires_grad();
  ops::relu(x).backward(ones({3}, DType::f64));
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{0, 1, 1}));
  x.zero_grad();
  ops::sigmoid(x).backward(ones({3}, DType::f64));
  double s = 1 / (1 + std::exp(-0.5));
  EXPECT_NEAR(x.grad().to_vector<double>()[1], s * (1 - s), 1e-15);
  x.zero_grad();
  Tensor zero = tensor({0}, DType::f64).set_requires_grad();
  ops::gelu(zero).backward(ones({1}, DType::f64));
  EXPECT_DOUBLE_EQ(zero.grad().item(), 0.5);
  zero.zero_grad();
  ops::pow(zero, 0.0).backward(ones({1}, DType::f64));  // 0 * 0^-1 would be NaN
  EXPECT_EQ(zero.grad().item(), 0.0);
}

TEST(Unary, HalfAndBfloat16AreComputedInFloat32AndRounded) {
  std::vector<NamedUnary> all = unary_ops();
  all.push_back({"relu", ops::relu, -1.0, 1.0});
  for (DType dtype : {DType::f16, DType::bf16}) {
    for (const NamedUnary& op : all) {
      SCOPED_TRACE(::testing::Message() << op.name << " in " << dtype);
      Tensor x = random_f64({4, 33}, 7, op.low, op.high).to(dtype);
      Tensor out = op.fn(x);
      EXPECT_EQ(out.dtype(), dtype);
      EXPECT_EQ(out.to_vector<float>(), op.fn(x.to(DType::f32)).to(dtype).to_vector<float>());
    }
  }
  // Rounded to nearest: e = 2.71828... is 2.71875 in f16, sqrt(2) = 1.41421... is 1.4140625 in bf16.
  EXPECT_EQ(ops::exp(tensor({1}, DType::f16)).item(), 2.71875);
  EXPECT_EQ(ops::sqrt(tensor({2}, DType::bf16)).item(), 1.4140625);
}

TEST(Unary, HalfGradientsKeepTheInputDtype) {
  Tensor x = tensor({-1, 0.5, 2}, DType::f16).set_requires_grad();
  ops::sum(ops::tanh(x)).backward();
  ASSERT_EQ(x.grad().dtype(), DType::f16);
  std::vector<double> grad = x.grad().to_vector<double>();
  for (int i = 0; i < 3; ++i) {
    double t = std::tanh(std::vector<double>{-1, 0.5, 2}[i]);
    EXPECT_NEAR(grad[i], 1 - t * t, 2e-3);
  }
}

TEST(Unary, LargeTensorsUseEveryElement) {
  // Above the parallel grain, with an odd size: the threaded loop must cover every element once.
  Tensor x = random_f64({3, 40001}, 5, -3.0, 3.0);
  std::vector<double> in = x.to_vector<double>(), out = ops::gelu(x).to_vector<double>();
  for (size_t i = 0; i < in.size(); ++i) {
    double v = in[i];
    ASSERT_NEAR(out[i], 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v))), 1e-15)
        << "element " << i;
  }
}

TEST(Unary, NoGraphWithoutRequiresGrad) {
  Tensor x = random_f64({3}, 1).set_requires_grad();
  EXPECT_TRUE(ops::gelu(x).requires_grad());
  EXPECT_FALSE(ops::gelu(x.detach()).requires_grad());
  NoGradGuard no_grad;
  EXPECT_FALSE(ops::tanh(x).requires_grad());
}

TEST(Unary, CastConvertsAndItsGradientConvertsBack) {
  Tensor x = tensor({1.5, -2.25, 1.0 / 3}, DType::f64);
  Tensor h = ops::cast(x, DType::f16);
  EXPECT_EQ(h.dtype(), DType::f16);
  EXPECT_EQ(h.to_vector<double>(), (std::vector<double>{1.5, -2.25, 0.333251953125}));
  EXPECT_TRUE(ops::cast(x, DType::f64).same(x));
  EXPECT_EQ(ops::cast(tensor({2.7, -1.5}), DType::i64).to_vector<int64_t>(), (std::vector<int64_t>{2, -1}));

  Tensor leaf = tensor({1, 2}, DType::f32).set_requires_grad();
  ops::sum(ops::mul(ops::cast(leaf, DType::f64), tensor({3, 4}, DType::f64))).backward();
  ASSERT_EQ(leaf.grad().dtype(), DType::f32);
  EXPECT_EQ(leaf.grad().to_vector<float>(), (std::vector<float>{3, 4}));
  // Through float32 and back: a linear map, so a coarse step is exact up to f32 rounding.
  expect_gradients_match(
      [](const std::vector<Tensor>& in) { return ops::cast(ops::cast(in[0], DType::f32), DType::f64); },
      {random_f64({2, 3, 7}, 3)}, 1e-2, 1e-4, 1e-4);
}

TEST(Unary, ErrorsNameTheOp) {
  Tensor ints = arange(0, 3);
  EXPECT_EQ(error_of([&] { ops::log(ints); }), "log: input must be a floating tensor, got int64[3] on cpu");
  EXPECT_EQ(error_of([&] { ops::gelu(Tensor()); }), "gelu: input is an undefined tensor");
  EXPECT_EQ(error_of([&] { ops::cast(Tensor(), DType::f32); }), "cast: input is an undefined tensor");
  for (UnaryFn fn : {ops::exp, ops::log, ops::sqrt, ops::rsqrt, ops::tanh, ops::sigmoid, ops::relu, ops::gelu})
    EXPECT_THROW(fn(ints), Error);
  EXPECT_EQ(error_of([&] { ops::pow(ints, 2.0); }), "pow: input must be a floating tensor, got int64[3] on cpu");
}
