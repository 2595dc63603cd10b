#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "core/philox.h"
#include "ops/ops.h"
#include "support/gradcheck.h"

using namespace precis;
using precis::testing::expect_gradients_match;
using precis::testing::random_f64;

namespace {

std::vector<bool> zero_pattern(const Tensor& t) {
  std::vector<double> v = t.to_vector<double>();
  std::vector<bool> zero(v.size());
  for (size_t i = 0; i < v.size(); ++i) zero[i] = v[i] == 0;
  return zero;
}

}  // namespace

TEST(Dropout, FractionOfZerosIsCloseToP) {
  Tensor x = ones({1 << 10, 1 << 10});
  Generator gen(11);
  for (double p : {0.1, 0.5, 0.9}) {
    std::vector<float> out = ops::dropout(x, p, true, &gen).to_vector<float>();
    int64_t zeros = 0;
    for (float v : out) zeros += v == 0;
    // The fraction's standard deviation is at most 0.0005 here; 0.005 is ten of them.
    EXPECT_NEAR(static_cast<double>(zeros) / out.size(), p, 0.005) << "p = " << p;
  }
}

TEST(Dropout, KeptValuesAreScaledAndTheMaskFollowsPhilox) {
  const double p = 0.3;
  const int64_t n = 2 * 3 * 7;
  Tensor x = random_f64({2, 3, 7}, 4, 0.5, 1.5);
  Generator gen(123);
  gen.set_offset(5);
  Tensor out = ops::dropout(x, p, true, &gen);
  EXPECT_EQ(out.shape(), x.shape());
  EXPECT_EQ(out.dtype(), DType::f64);
  EXPECT_EQ(gen.offset(), 5u + (n + 3) / 4);  // n numbers reserved, four per block
  std::vector<double> in = x.to_vector<double>(), got = out.to_vector<double>();
  int kept = 0;
  for (int64_t i = 0; i < n; ++i) {
    bool keep = uniform_from_bits(philox_word(123, 5, i)) >= p;
    kept += keep;
    if (keep) {
      EXPECT_DOUBLE_EQ(got[i], in[i] / (1 - p)) << "element " << i;
    } else {
      EXPECT_EQ(got[i], 0.0) << "element " << i;
    }
  }
  EXPECT_GT(kept, 0);
  EXPECT_LT(kept, n);
}

TEST(Dropout, SameSeedSameMaskAndNextCallDiffers) {
  Tensor x = ones({64, 65});
  Generator a(7), b(7);
  Tensor first = ops::dropout(x, 0.5, true, &a);
  EXPECT_EQ(first.to_vector<float>(), ops::dropout(x, 0.5, true, &b).to_vector<float>());
  EXPECT_NE(zero_pattern(first), zero_pattern(ops::dropout(x, 0.5, true, &a)));
  // The default generator, reseeded, repeats itself too.
  manual_seed(3);
  Tensor c = ops::dropout(x, 0.5, true);
  manual_seed(3);
  EXPECT_EQ(c.to_vector<float>(), ops::dropout(x, 0.5, true).to_vector<float>());
}

TEST(Dropout, StridedInputUsesTheMaskOfItsLogicalOrder) {
  Tensor x = random_f64({5, 9}, 2);
  Generator a(9), b(9);
  Tensor strided = ops::dropout(x.t(), 0.4, true, &a);
  Tensor dense = ops::dropout(x.t().contiguous(), 0.4, true, &b);
  EXPECT_EQ(strided.to_vector<double>(), dense.to_vector<double>());
}

TEST(Dropout, GradientIsTheMaskTimesTheScale) {
  const double p = 0.25;
  Tensor x = ones({3, 5}, DType::f64).set_requires_grad();
  Generator gen(1);
  Tensor out = ops::dropout(x, p, true, &gen);
  Tensor g = random_f64({3, 5}, 8);
  out.backward(g);
  std::vector<double> y = out.to_vector<double>(), grad = x.grad().to_vector<double>(), gv = g.to_vector<double>();
  int64_t dropped = std::count(y.begin(), y.end(), 0.0);
  EXPECT_GT(dropped, 0);
  EXPECT_LT(dropped, static_cast<int64_t>(y.size()));
  for (size_t i = 0; i < y.size(); ++i) {
    EXPECT_DOUBLE_EQ(grad[i], y[i] == 0 ? 0.0 : gv[i] / (1 - p)) << "element " << i;
  }
  // A fresh generator per call gives the same mask each time, so finite differences apply.
  for (const Shape& shape : std::vector<Shape>{{3, 5}, {2, 3, 7}}) {
    expect_gradients_match(
        [](const std::vector<Tensor>& in) {
          Generator fixed(17);
          return ops::dropout(in[0], 0.4, true, &fixed);
        },
        {random_f64(shape, 6)});
  }
}

TEST(Dropout, EvalModeAndZeroPAreTheIdentity) {
  Tensor x = random_f64({4, 3}, 1).set_requires_grad();
  Generator gen(5);
  EXPECT_TRUE(ops::dropout(x, 0.5, false, &gen).same(x));
  EXPECT_TRUE(ops::dropout(x, 0.0, true, &gen).same(x));
  EXPECT_EQ(gen.offset(), 0u);  // no numbers drawn
}

TEST(Dropout, PEqualToOneGivesZerosAndZeroGradient) {
  Tensor x = random_f64({3, 7}, 1).set_requires_grad();
  Generator gen(5);
  Tensor out = ops::dropout(x, 1.0, true, &gen);
  EXPECT_EQ(out.to_vector<double>(), std::vector<double>(21, 0.0));
  ops::sum(out).backward();
  EXPECT_EQ(x.grad().to_vector<double>(), std::vector<double>(21, 0.0));
}

TEST(Dropout, HalfKeepsItsDtypeAndRoundsTheScaledValue) {
  Tensor x = random_f64({8, 33}, 3).to(DType::f16);
  Generator a(2), b(2);
  Tensor out = ops::dropout(x, 0.3, true, &a);
  EXPECT_EQ(out.dtype(), DType::f16);
  Tensor reference = ops::dropout(x.to(DType::f32), 0.3, true, &b).to(DType::f16);
  EXPECT_EQ(out.to_vector<float>(), reference.to_vector<float>());
}

TEST(Dropout, Errors) {
  Tensor x = zeros({2});
  auto message = [&](double p) {
    try {
      ops::dropout(x, p, true);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(message(1.5), "dropout: p must be in [0, 1], got 1.5");
  EXPECT_EQ(message(-0.1), "dropout: p must be in [0, 1], got -0.1");
  EXPECT_EQ(message(NAN), "dropout: p must be in [0, 1], got nan");
  // Checked in eval mode too, as a bad p is a bug either way.
  EXPECT_THROW(ops::dropout(x, 2.0, false), Error);
  try {
    ops::dropout(arange(0, 4), 0.5, true);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "dropout: input must be a floating tensor, got int64[4] on cpu");
  }
}
