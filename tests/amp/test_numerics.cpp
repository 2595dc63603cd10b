#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "amp/numerics.h"
#include "ops/ops.h"
#include "ops/tap.h"

using namespace precis;

TEST(Numerics, CountsEachCategory) {
  const double inf = std::numeric_limits<double>::infinity(), nan = std::nan("");
  // 0, a normal value, two fp16 subnormals (one so small it rounds to zero in fp16), inf, nan, a negative max.
  Tensor t = tensor({0.0, 1.5, 1e-5, 1e-9, inf, nan, -70000.0, 2.0}, DType::f64);
  amp::TensorNumerics s;
  s.add_values(t);
  EXPECT_EQ(s.count, 8);
  EXPECT_EQ(s.zero, 1);
  EXPECT_EQ(s.fp16_subnormal, 2);
  EXPECT_EQ(s.fp16_underflow, 1);
  EXPECT_EQ(s.inf, 1);
  EXPECT_EQ(s.nan, 1);
  EXPECT_EQ(s.max_abs, 70000.0);
  Json j = s.json();
  EXPECT_DOUBLE_EQ(j.at("zero").as_double(), 1.0 / 8);
}

TEST(Numerics, UpdatesSmallerThanHalfAnUlpAreLost) {
  // bf16 has 8 bits of precision: near 1.0 its ulp is 2^-7. An update of 1e-3 is lost,
  // one of 0.01 is not.
  Tensor before = tensor({1.0, 1.0, 1.0}, DType::bf16);
  Tensor intended = tensor({1.0 - 1e-3, 1.0 - 0.01, 1.0}, DType::f32);
  Tensor after = intended.to(DType::bf16);
  Tensor grad = tensor({1.0, 1.0, 0.0});
  amp::TensorNumerics s;
  s.add_update(before, after, grad);
  EXPECT_EQ(s.eligible, 2);  // the third had no gradient
  EXPECT_EQ(s.lost, 1);
}

TEST(Numerics, UpdatesNeedAFiniteNonzeroGradientAndLeaveNanDeltasOutOfTheMax) {
  const double inf = std::numeric_limits<double>::infinity(), nan = std::nan("");
  // Deltas: NaN (inf - inf), 1, 0, 0, 0, 0; gradients: 1, 1, 1, 0, inf, NaN.
  Tensor before = tensor({inf, 1.0, 0.5, 0.5, 0.5, 0.5}, DType::f64);
  Tensor after = tensor({inf, 2.0, 0.5, 0.5, 0.5, 0.5}, DType::f64);
  Tensor grad = tensor({1.0, 1.0, 1.0, 0.0, inf, nan}, DType::f64);
  amp::TensorNumerics s;
  s.add_update(before, after, grad);
  EXPECT_EQ(s.count, 6);
  EXPECT_EQ(s.max_abs, 1.0);
  EXPECT_EQ(s.zero, 4);
  EXPECT_EQ(s.eligible, 3);
  EXPECT_EQ(s.lost, 1);  // only the unchanged value with a finite nonzero gradient
  // A parameter that became inf: an infinite max.
  s.add_update(tensor({1.0}, DType::f64), tensor({inf}, DType::f64), tensor({1.0}, DType::f64));
  EXPECT_EQ(s.max_abs, inf);
}

TEST(Numerics, ValuesAtTheThresholds) {
  // 2^-14 is fp16's smallest normal (not subnormal); 2^-25 is half its smallest subnormal (subnormal, not underflow).
  const double min_normal = std::ldexp(1.0, -14), half_min_subnormal = std::ldexp(1.0, -25);
  Tensor t = tensor(
      {min_normal, std::nextafter(min_normal, 0.0), half_min_subnormal, std::nextafter(half_min_subnormal, 0.0), -0.0},
      DType::f64);
  amp::TensorNumerics s;
  s.add_values(t);
  EXPECT_EQ(s.zero, 1);
  EXPECT_EQ(s.fp16_subnormal, 3);
  EXPECT_EQ(s.fp16_underflow, 1);
  EXPECT_EQ(s.max_abs, min_normal);
}

TEST(Numerics, LayerOfParameterNames) {
  EXPECT_EQ(amp::layer_of("transformer.h.3.attn.c_attn.weight"), "transformer.h.3");
  EXPECT_EQ(amp::layer_of("transformer.wte.weight"), "transformer.wte");
  EXPECT_EQ(amp::layer_of("lm_head.weight"), "lm_head");
}

TEST(Numerics, TableAndJsonHaveOneRowPerKindAndName) {
  amp::NumericsReport report;
  report.record(amp::NumericsKind::activation, "transformer.h.0", tensor({1.0, 2.0}));
  report.record(amp::NumericsKind::activation, "transformer.h.0", tensor({4.0}));
  report.record(amp::NumericsKind::gradient, "transformer.h.0", tensor({1e-9}));
  auto rows = report.json(10, 1024);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].at("count").as_int(), 3);
  EXPECT_EQ(rows[0].at("max_abs").as_double(), 4.0);
  EXPECT_EQ(rows[1].at("kind").as_string(), "gradient");
  EXPECT_EQ(rows[1].at("loss_scale").as_double(), 1024.0);
  std::string table = report.table(10, 1024);
  EXPECT_NE(table.find("numerics at step 10 (loss scale 1024"), std::string::npos) << table;
  EXPECT_NE(table.find("gradient"), std::string::npos);
}

TEST(Tap, SeesTheValueForwardAndTheGradientBackward) {
  Tensor x = tensor({1.0, 2.0}, DType::f64).set_requires_grad();
  double seen_forward = 0, seen_backward = 0;
  Tensor y = ops::tap(
      x * 3.0, [&](const Tensor& t) { seen_forward = t.to_vector<double>()[1]; },
      [&](const Tensor& g) { seen_backward = g.to_vector<double>()[0]; });
  ops::sum(y * 5.0).backward();
  EXPECT_EQ(seen_forward, 6.0);
  EXPECT_EQ(seen_backward, 5.0);
  EXPECT_EQ(x.grad().to_vector<double>()[0], 15.0);
}
