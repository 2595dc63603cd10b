// The GradScaler's cases, parameterised over the device (tests/support/devices.h): the
// state machine against hand-computed sequences (growth after growth_interval clean
// steps, backoff with hysteresis, floor and ceiling, skipped steps), the unscale against
// a reference computed here, the loss product, and the saved state. Instantiated for the
// CPU by test_grad_scaler.cpp and for the GPU by test_grad_scaler_gpu.cpp.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "amp/grad_scaler.h"
#include "core/copy.h"
#include "core/random.h"
#include "nn/linear.h"
#include "ops/elementwise.h"
#include "ops/reduce.h"
#include "support/devices.h"

namespace grad_scaler_cases {

using namespace precis;
using amp::GradScaler;
using amp::GradScalerOptions;
using amp::ScalerMode;

constexpr float kInf = std::numeric_limits<float>::infinity();

class GradScalerOn : public precis::testing::OnDevice {
 protected:
  GradScaler make(GradScalerOptions options = {}) const { return GradScaler(options, device()); }

  // One training step as the trainer runs it: the gradient is `scale` times 0.5 (what
  // backward of a scaled loss gives), optionally with one element poisoned; unscale_,
  // then update. Returns the step's found_inf.
  bool step(GradScaler& scaler, float poison = 0.0f) const {
    Tensor host = full({8}, 0.5 * scaler.scale());
    if (poison != 0.0f) host.data<float>()[3] = poison;
    Tensor g = host.to(device());
    scaler.unscale_({g});
    const bool found = scaler.found_inf().item<double>() != 0;
    if (!found) {
      for (float x : g.to_vector<float>()) EXPECT_NEAR(x, 0.5f, 1e-6);
    }
    scaler.update();
    return found;
  }
};

TEST_P(GradScalerOn, DefaultsMatchPyTorch) {
  GradScaler scaler = make();
  EXPECT_EQ(scaler.scale(), 65536.0);
  EXPECT_EQ(scaler.options().growth_factor, 2.0);
  EXPECT_EQ(scaler.options().backoff_factor, 0.5);
  EXPECT_EQ(scaler.options().growth_interval, 2000);
  EXPECT_EQ(scaler.options().hysteresis, 1);
  EXPECT_EQ(scaler.skipped_steps(), 0);
  EXPECT_EQ(scaler.growth_tracker(), 0);
}

TEST_P(GradScalerOn, OverflowAtStepKIsReportedSkippedAndHalvesTheScale) {
  for (float poison : {kInf, -kInf, std::numeric_limits<float>::quiet_NaN()}) {
    GradScaler scaler = make();
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

TEST_P(GradScalerOn, GrowsAfterExactlyGrowthIntervalCleanSteps) {
  GradScaler scaler = make({.init_scale = 1024, .growth_interval = 3});
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

TEST_P(GradScalerOn, FloorAndCeilingAreRespected) {
  GradScaler low = make({.init_scale = 4, .min_scale = 2});
  step(low, kInf);
  EXPECT_EQ(low.scale(), 2.0);
  step(low, kInf);
  EXPECT_EQ(low.scale(), 2.0);
  EXPECT_EQ(low.skipped_steps(), 2);

  GradScaler high = make({.init_scale = 6291456, .growth_factor = 3, .growth_interval = 1});  // 1.5 * 2^22
  step(high);
  EXPECT_EQ(high.scale(), 16777216.0);  // 4.5 * 2^22 capped at 2^24
  step(high);
  EXPECT_EQ(high.scale(), 16777216.0);
}

TEST_P(GradScalerOn, HysteresisBacksOffOnlyAfterConsecutiveOverflows) {
  GradScaler scaler = make({.init_scale = 1024, .hysteresis = 3});
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

TEST_P(GradScalerOn, UnscaleMultipliesByExactlyTheInverseOfTheScale) {
  // 3 is not a power of two, so 1/scale is rounded: the reference rounds it to f32 as the op must.
  GradScaler scaler = make({.mode = ScalerMode::fixed, .init_scale = 3});
  Generator gen(7);
  Tensor g32 = rand({40000}, DType::f32, &gen, -1e4, 1e4);
  Tensor g64 = rand({33}, DType::f64, &gen, -1e4, 1e4);
  Tensor g16 = rand({33}, DType::bf16, &gen, -1e4, 1e4);
  std::vector<float> in32 = g32.to_vector<float>(), in16 = g16.to_vector<float>();
  std::vector<double> in64 = g64.to_vector<double>();
  Tensor d32 = g32.to(device()), d64 = g64.to(device()), d16 = g16.to(device());
  scaler.unscale_({d32, d64, d16});
  EXPECT_EQ(scaler.found_inf().item<double>(), 0.0);
  const float inv32 = static_cast<float>(1.0 / 3.0);
  std::vector<float> out32 = d32.to_vector<float>(), out16 = d16.to_vector<float>();
  std::vector<double> out64 = d64.to_vector<double>();
  for (size_t i = 0; i < in32.size(); ++i) ASSERT_EQ(out32[i], in32[i] * inv32) << i;
  for (size_t i = 0; i < in64.size(); ++i) ASSERT_EQ(out64[i], in64[i] * (1.0 / 3.0)) << i;
  for (size_t i = 0; i < in16.size(); ++i) ASSERT_EQ(out16[i], static_cast<float>(bfloat16(in16[i] * inv32))) << i;
}

TEST_P(GradScalerOn, UnscaleFindsInfAndNanInEveryDtypeAndClearsTheFlagFirst) {
  GradScaler scaler = make({.init_scale = 4});
  for (DType dtype : {DType::f32, DType::f16, DType::bf16, DType::f64}) {
    for (double bad :
         {std::numeric_limits<double>::infinity(), -std::numeric_limits<double>::infinity(), std::nan("")}) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + " " + std::to_string(bad));
      Tensor host = full({4099}, 2.0, dtype);
      fill_(host.slice(0, 4098, 4099), bad);
      scaler.unscale_({host.to(device())});
      EXPECT_EQ(scaler.found_inf().item<double>(), 1.0);
      scaler.unscale_({full({5}, 2.0, dtype, device())});
      EXPECT_EQ(scaler.found_inf().item<double>(), 0.0) << "each unscale_ starts from a clear flag";
    }
  }
}

TEST_P(GradScalerOn, ScaledLossBackpropagatesTheScale) {
  GradScaler scaler = make();
  Tensor x = tensor({1.0, 2.0, 3.0}).to(device()).set_requires_grad();
  Tensor scaled = scaler.scale(ops::sum(x));
  EXPECT_EQ(scaled.item(), 6.0 * 65536);
  scaled.backward();
  for (float g : x.grad().to_vector<float>()) EXPECT_EQ(g, 65536.0f);
  // An f16 loss times 2^16 would overflow f16; the scaled loss is f32.
  Tensor loss16 = full({}, 4.0, DType::f16, device());
  Tensor scaled16 = scaler.scale(loss16);
  EXPECT_EQ(scaled16.dtype(), DType::f32);
  EXPECT_EQ(scaled16.item(), 4.0 * 65536);
}

TEST_P(GradScalerOn, StateRoundTripsExactlyAndContinuesIdentically) {
  GradScalerOptions options{.init_scale = 3000.5, .growth_interval = 4, .hysteresis = 2};
  GradScaler a = make(options);
  step(a);
  step(a, kInf);
  step(a, kInf);
  step(a);
  step(a, kInf);
  ASSERT_EQ(a.consecutive_overflows(), 1);
  ASSERT_EQ(a.scale(), 1500.25);
  GradScaler b = make(options);
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
  GradScaler fixed = make({.mode = ScalerMode::fixed});
  try {
    fixed.load_state(a.state());
    FAIL() << "a fixed scaler loaded a dynamic one's state";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("saved by a dynamic scaler, but this one is fixed"), std::string::npos)
        << e.what();
  }
}

TEST_P(GradScalerOn, FixedModeNeverChangesTheScaleButStillSkips) {
  GradScaler scaler = make({.mode = ScalerMode::fixed, .init_scale = 128, .growth_interval = 2});
  for (int t = 0; t < 10; ++t) {
    bool found = step(scaler, t % 3 == 0 ? kInf : 0.0f);
    EXPECT_EQ(found, t % 3 == 0);
    EXPECT_EQ(scaler.scale(), 128.0);
  }
  EXPECT_EQ(scaler.skipped_steps(), 4);
}

TEST_P(GradScalerOn, DisabledIsTheIdentity) {
  GradScaler scaler = make({.enabled = false});
  EXPECT_EQ(scaler.scale(), 1.0);
  Tensor loss = full({}, 2.5, DType::f32, device());
  EXPECT_TRUE(scaler.scale(loss).same(loss));
  Tensor g = tensor({1.0, kInf}).to(device());
  scaler.unscale_({g});
  EXPECT_EQ(g.to_vector<float>()[0], 1.0f);
  EXPECT_FALSE(scaler.scale_tensor().defined());
  EXPECT_EQ(scaler.found_inf().item<double>(), 0.0) << "unscale_ does not check when nothing is scaled";
  scaler.update();
  EXPECT_EQ(scaler.skipped_steps(), 0);
}

// Without loss scaling the flag clip_grad_norm sets still skips and counts non-finite steps
// (what the trainer's on_nonfinite rule reads), and the scale stays 1.
TEST_P(GradScalerOn, DisabledStillCountsNonFiniteSteps) {
  GradScaler scaler = make({.enabled = false});
  for (double found : {1.0, 1.0, 1.0, 0.0, 1.0}) {
    fill_(scaler.found_inf(), found);
    scaler.update();
  }
  EXPECT_EQ(scaler.skipped_steps(), 4);
  EXPECT_EQ(scaler.consecutive_overflows(), 1) << "the clean step reset the run of bad ones";
  EXPECT_EQ(scaler.scale(), 1.0);
}

TEST_P(GradScalerOn, FixedModeCountsConsecutiveSkippedSteps) {
  GradScaler scaler = make({.mode = ScalerMode::fixed, .init_scale = 128.0});
  for (int i = 0; i < 3; ++i) {
    fill_(scaler.found_inf(), 1.0);
    scaler.update();
  }
  EXPECT_EQ(scaler.consecutive_overflows(), 3);
  EXPECT_EQ(scaler.scale(), 128.0) << "a fixed scale never backs off";
}

}  // namespace grad_scaler_cases
