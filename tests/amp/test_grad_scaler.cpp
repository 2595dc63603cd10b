// The GradScaler on the CPU: the device-parameterised cases (amp/grad_scaler_cases.h;
// their GPU instance is test_grad_scaler_gpu.cpp) and the option checks.
#include "amp/grad_scaler_cases.h"

using namespace precis;
using amp::GradScaler;
using amp::GradScalerOptions;
using amp::ScalerMode;

namespace grad_scaler_cases {
INSTANTIATE_TEST_SUITE_P(Cpu, GradScalerOn, ::testing::Values(Device::cpu()), precis::testing::device_name);
}  // namespace grad_scaler_cases

namespace {

std::string error_of(const GradScalerOptions& options) {
  try {
    GradScaler scaler(options);
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace

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
