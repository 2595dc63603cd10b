#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "amp/grad_scaler.h"
#include "core/copy.h"
#include "core/random.h"
#include "nn/linear.h"
#include "ops/elementwise.h"
#include "ops/reduce.h"

using namespace precis;
using amp::GradScaler;
using amp::GradScalerOptions;
using amp::ScalerMode;

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// One training step as the trainer runs it: the gradient is `scale` times 0.5
// (what backward of a scaled loss gives), optionally with one element poisoned.
bool step(GradScaler& scaler, float poison = 0.0f) {
  Tensor g = full({8}, 0.5 * scaler.scale());
  if (poison != 0.0f) g.data<float>()[3] = poison;
  bool found = scaler.unscale_and_check({g});
  if (!found) {
    for (float x : g.to_vector<float>()) EXPECT_NEAR(x, 0.5f, 1e-6);
  }
  scaler.update(found);
  return found;
}

std::string error_of(const GradScalerOptions& options) {
  try {
    GradScaler scaler(options);
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace

TEST(GradScaler, DefaultsMatchPyTorch) {
  GradScaler scaler;
  EXPECT_EQ(scaler.scale(), 65536.0);
  EXPECT_EQ(scaler.options().growth_factor, 2.0);
  EXPECT_EQ(scaler.options().backoff_factor, 0.5);
  EXPECT_EQ(scaler.options().growth_interval, 2000);
  EXPECT_EQ(scaler.options().hysteresis, 1);
  EXPECT_EQ(scaler.skipped_steps(), 0);
  EXPECT_EQ(scaler.growth_tracker(), 0);
}

TEST(GradScaler, OverflowAtStepKIsReportedSkippedAndHalvesTheScale) {
  for (float poison : {kInf, -kInf, std::numeric_limits<float>::quiet_NaN()}) {
    GradScaler scaler;
    const int k = 5;
    for (int t = 0; t < 10; ++t) {
      double before = scaler.scale();
      bool found = step(scaler, t == k ? poison : 0.0f);
      EXPECT_EQ(found, t == k) << "step " << t << " poison " << poison;
      EXPECT_EQ(scaler.scale(), t == k ? before * 0.5 : before) << "step " << t;
      EXPECT_EQ(scaler.growth_tracker(), t < k ? t + 1 : t - k) << "step " << t;
    }
    EXPECT_EQ(scaler.scale(), 32768.0);
    EXPECT_EQ(scaler.skipped_steps(), 1);
  }
}

TEST(GradScaler, GrowsAfterExactlyGrowthIntervalCleanSteps) {
  GradScaler scaler({.init_scale = 1024, .growth_interval = 3});
  step(scaler);
  step(scaler);
  EXPECT_EQ(scaler.scale(), 1024.0);
  EXPECT_EQ(scaler.growth_tracker(), 2);
  step(scaler, kInf);  // an overflow restarts the count
  EXPECT_EQ(scaler.scale(), 512.0);
  EXPECT_EQ(scaler.growth_tracker(), 0);
  step(scaler);
  step(scaler);
  EXPECT_EQ(scaler.scale(), 512.0);
  step(scaler);
  EXPECT_EQ(scaler.scale(), 1024.0);
  EXPECT_EQ(scaler.growth_tracker(), 0);
  for (int t = 0; t < 3; ++t) step(scaler);
  EXPECT_EQ(scaler.scale(), 2048.0);
  EXPECT_EQ(scaler.skipped_steps(), 1);
}

TEST(GradScaler, FloorAndCeilingAreRespected) {
  GradScaler low({.init_scale = 4, .min_scale = 2});
  step(low, kInf);
  EXPECT_EQ(low.scale(), 2.0);
  step(low, kInf);
  EXPECT_EQ(low.scale(), 2.0);
  EXPECT_EQ(low.skipped_steps(), 2);

  GradScaler high({.init_scale = 6291456, .growth_factor = 3, .growth_interval = 1});  // 1.5 * 2^22
  step(high);
  EXPECT_EQ(high.scale(), 16777216.0);  // 4.5 * 2^22 capped at 2^24
  step(high);
  EXPECT_EQ(high.scale(), 16777216.0);
}

TEST(GradScaler, HysteresisBacksOffOnlyAfterConsecutiveOverflows) {
  GradScaler scaler({.init_scale = 1024, .hysteresis = 3});
  step(scaler, kInf);
  step(scaler, kInf);
  EXPECT_EQ(scaler.scale(), 1024.0);
  EXPECT_EQ(scaler.consecutive_overflows(), 2);
  step(scaler, kInf);
  EXPECT_EQ(scaler.scale(), 512.0);
  step(scaler, kInf);  // still overflowing: every further overflow backs off
  EXPECT_EQ(scaler.scale(), 256.0);
  step(scaler);  // a clean step resets the count
  EXPECT_EQ(scaler.consecutive_overflows(), 0);
  step(scaler, kInf);
  step(scaler, kInf);
  EXPECT_EQ(scaler.scale(), 256.0);
  step(scaler);
  step(scaler, kInf);
  step(scaler, kInf);
  EXPECT_EQ(scaler.scale(), 256.0);
  step(scaler, kInf);
  EXPECT_EQ(scaler.scale(), 128.0);
  EXPECT_EQ(scaler.skipped_steps(), 9);
}

TEST(GradScaler, UnscaleMultipliesByExactlyTheInverseOfTheScale) {
  // 3 is not a power of two, so 1/scale is rounded: the reference rounds it to f32 as the kernel must.
  GradScaler scaler({.mode = ScalerMode::fixed, .init_scale = 3});
  Generator gen(7);
  Tensor g32 = rand({40000}, DType::f32, &gen, -1e4, 1e4);
  Tensor g64 = rand({33}, DType::f64, &gen, -1e4, 1e4);
  Tensor g16 = rand({33}, DType::bf16, &gen, -1e4, 1e4);
  std::vector<float> in32 = g32.to_vector<float>(), in16 = g16.to_vector<float>();
  std::vector<double> in64 = g64.to_vector<double>();
  EXPECT_FALSE(scaler.unscale_and_check({g32, g64, g16}));
  const float inv32 = static_cast<float>(1.0 / 3.0);
  std::vector<float> out32 = g32.to_vector<float>(), out16 = g16.to_vector<float>();
  std::vector<double> out64 = g64.to_vector<double>();
  for (size_t i = 0; i < in32.size(); ++i) ASSERT_EQ(out32[i], in32[i] * inv32) << i;
  for (size_t i = 0; i < in64.size(); ++i) ASSERT_EQ(out64[i], in64[i] * (1.0 / 3.0)) << i;
  for (size_t i = 0; i < in16.size(); ++i) ASSERT_EQ(out16[i], static_cast<float>(bfloat16(in16[i] * inv32))) << i;
}

TEST(GradScaler, UnscalesEveryFlatGradientBufferInOnePass) {
  nn::Module model("two");
  model.register_module("a", std::make_shared<nn::Linear>(3, 4));
  model.register_module("b", std::make_shared<nn::Linear>(2, 2, nn::LinearOptions{.dtype = DType::f64}));
  auto flat = nn::flatten_parameters(model);
  ASSERT_EQ(flat->buffers().size(), 2u);
  GradScaler scaler({.init_scale = 1024});
  for (auto& b : flat->buffers()) fill_(b.grad, 2048.0);
  EXPECT_FALSE(scaler.unscale_and_check(*flat));
  for (auto& b : flat->buffers())
    for (double x : b.grad.to_vector<double>()) EXPECT_EQ(x, 2.0);
  flat->buffers()[1].grad.data<double>()[5] = std::numeric_limits<double>::quiet_NaN();
  EXPECT_TRUE(scaler.unscale_and_check(*flat));
  EXPECT_EQ(flat->buffers()[0].grad.to_vector<float>()[0], 2.0f / 1024);  // the pass went on over every buffer
}

TEST(GradScaler, ScaledLossBackpropagatesTheScale) {
  GradScaler scaler;
  Tensor x = tensor({1.0, 2.0, 3.0}).set_requires_grad();
  Tensor scaled = scaler.scale(ops::sum(x));
  EXPECT_EQ(scaled.item(), 6.0 * 65536);
  scaled.backward();
  for (float g : x.grad().to_vector<float>()) EXPECT_EQ(g, 65536.0f);
  // An f16 loss times 2^16 would overflow f16; the scaled loss is f32.
  Tensor loss16 = full({}, 4.0, DType::f16);
  Tensor scaled16 = scaler.scale(loss16);
  EXPECT_EQ(scaled16.dtype(), DType::f32);
  EXPECT_EQ(scaled16.item(), 4.0 * 65536);
}

TEST(GradScaler, StateRoundTripsExactlyAndContinuesIdentically) {
  GradScalerOptions options{.init_scale = 3000.5, .growth_interval = 4, .hysteresis = 2};
  GradScaler a(options);
  step(a);
  step(a, kInf);
  step(a, kInf);
  step(a);
  step(a, kInf);
  ASSERT_EQ(a.consecutive_overflows(), 1);
  ASSERT_EQ(a.scale(), 1500.25);
  GradScaler b(options);
  b.load_state(Json::parse(a.state().dump()));
  EXPECT_EQ(b.state(), a.state());
  EXPECT_EQ(b.scale(), a.scale());
  EXPECT_EQ(b.skipped_steps(), 3);
  EXPECT_EQ(b.growth_tracker(), 0);
  EXPECT_EQ(b.consecutive_overflows(), 1);
  for (float poison : {kInf, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f}) {
    step(a, poison);
    step(b, poison);
    EXPECT_EQ(b.state(), a.state());
  }
  EXPECT_EQ(b.scale(), 1500.25);  // the second overflow in a row backed off, four clean steps grew it back

  Json missing = a.state();
  missing.as_object().erase(missing.as_object().begin() + 1);
  try {
    b.load_state(missing);
    FAIL() << "loaded a state without a scale";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("missing 'scale'"), std::string::npos) << e.what();
  }
  GradScaler fixed({.mode = ScalerMode::fixed});
  try {
    fixed.load_state(a.state());
    FAIL() << "a fixed scaler loaded a dynamic one's state";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("saved by a dynamic scaler, but this one is fixed"), std::string::npos)
        << e.what();
  }
}

TEST(GradScaler, FixedModeNeverChangesTheScaleButStillSkips) {
  GradScaler scaler({.mode = ScalerMode::fixed, .init_scale = 128, .growth_interval = 2});
  for (int t = 0; t < 10; ++t) {
    bool found = step(scaler, t % 3 == 0 ? kInf : 0.0f);
    EXPECT_EQ(found, t % 3 == 0);
    EXPECT_EQ(scaler.scale(), 128.0);
  }
  EXPECT_EQ(scaler.skipped_steps(), 4);
}

TEST(GradScaler, DisabledIsTheIdentity) {
  GradScaler scaler({.enabled = false});
  EXPECT_EQ(scaler.scale(), 1.0);
  Tensor loss = full({}, 2.5);
  EXPECT_TRUE(scaler.scale(loss).same(loss));
  Tensor g = tensor({1.0, kInf});
  EXPECT_FALSE(scaler.unscale_and_check({g}));
  EXPECT_EQ(g.to_vector<float>()[0], 1.0f);
  scaler.update(true);
  EXPECT_EQ(scaler.skipped_steps(), 0);
}

TEST(GradScaler, OptionValidationNamesTheBadOption) {
  auto expect_error = [](const GradScalerOptions& options, const std::string& text) {
    std::string message = error_of(options);
    EXPECT_NE(message.find(text), std::string::npos) << message;
  };
  expect_error({.init_scale = 0}, "init_scale must be a finite number > 0, got 0");
  expect_error({.init_scale = std::numeric_limits<double>::infinity()}, "init_scale must be a finite number > 0");
  expect_error({.growth_factor = 1.0}, "growth_factor must be > 1, got 1");
  expect_error({.backoff_factor = 1.5}, "backoff_factor must be in (0, 1), got 1.5");
  expect_error({.backoff_factor = 0}, "backoff_factor must be in (0, 1), got 0");
  expect_error({.growth_interval = 0}, "growth_interval must be >= 1 step, got 0");
  expect_error({.hysteresis = 0}, "hysteresis must be >= 1 overflow step, got 0");
  expect_error({.min_scale = 0}, "need 0 < min_scale <= max_scale");
  expect_error({.min_scale = 8, .max_scale = 4}, "min_scale 8, max_scale 4");
  expect_error({.init_scale = 1e9}, "init_scale 1e+09 is outside [min_scale, max_scale] = [1, 1.67772e+07]");
  EXPECT_EQ(error_of({.mode = ScalerMode::fixed, .init_scale = 1e9}), "no error");
  EXPECT_EQ(amp::parse_scaler_mode("fixed"), ScalerMode::fixed);
  EXPECT_EQ(amp::parse_scaler_mode("static"), ScalerMode::fixed);
  EXPECT_EQ(amp::parse_scaler_mode("dynamic"), ScalerMode::dynamic);
  try {
    amp::parse_scaler_mode("constant");
    FAIL() << "parsed an unknown mode";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown mode 'constant'"), std::string::npos) << e.what();
  }
}
