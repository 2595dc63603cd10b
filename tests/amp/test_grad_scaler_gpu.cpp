// The GPU unscale-and-check against the CPU one.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "amp/grad_scaler.h"
#include "core/copy.h"
#include "core/random.h"
#include "support/gpu.h"
#include "support/gradcheck.h"

using namespace precis;
using precis::testing::expect_close;

TEST(GradScalerGpu, UnscaleMatchesTheCpuAndFindsInfAndNan) {
  PRECIS_SKIP_WITHOUT_GPU();
  amp::GradScaler scaler({.init_scale = 3.0});  // 1/3 is inexact: rounding must match too
  for (DType dtype : {DType::f32, DType::f16, DType::bf16, DType::f64}) {
    for (int64_t n : {1, 7, 4099, 1 << 20}) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + " n=" + std::to_string(n));
      Generator gen(static_cast<uint64_t>(n));
      Tensor cpu = rand({n}, DType::f32, &gen, -100, 100).to(dtype);
      Tensor gpu = cpu.to(Device::cuda(0));
      EXPECT_FALSE(scaler.unscale_and_check(std::vector<Tensor>{gpu}));
      EXPECT_FALSE(scaler.unscale_and_check(std::vector<Tensor>{cpu}));
      expect_close(gpu.to(Device::cpu()), cpu, 0, 0);
      for (double bad : {std::numeric_limits<double>::infinity(), std::nan("")}) {
        Tensor poisoned = cpu.clone();
        fill_(poisoned.slice(0, n - 1, n), bad);
        EXPECT_TRUE(scaler.unscale_and_check(std::vector<Tensor>{poisoned.to(Device::cuda(0))}));
      }
    }
  }
}

// The device-resident scaler (keep_on_device) against the host one, step by step: the same
// unscaled gradients, found_inf flag, scale and counters, through growth, hysteresis,
// backoff to the floor and the ceiling; then its state saved and loaded.
TEST(GradScalerGpu, DeviceStateFollowsTheHostStateMachine) {
  PRECIS_SKIP_WITHOUT_GPU();
  const amp::GradScalerOptions options{.init_scale = 3.0,  // 1/3 is inexact: the unscale must round alike
                                       .growth_factor = 2.0,
                                       .backoff_factor = 0.25,
                                       .growth_interval = 3,
                                       .min_scale = 0.5,
                                       .max_scale = 24.0,
                                       .hysteresis = 2};
  amp::GradScaler host(options), device(options);
  device.keep_on_device(Device::cuda(0));
  ASSERT_TRUE(device.on_device());
  // Overflow runs of 1 (hysteresis holds), 2 and 5 (backoff, down to the floor), and long clean runs (growth to the ceiling).
  const std::string pattern = "..x.....xx..........xxxxx.......x...............";
  for (size_t step = 0; step < pattern.size(); ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    const bool overflow = pattern[step] == 'x';
    Generator gen(step + 1);
    Tensor cpu = rand({4099}, DType::f32, &gen, -100, 100);
    if (overflow) fill_(cpu.slice(0, 17 * step % 4099, 17 * step % 4099 + 1), step % 2 ? std::nan("") : INFINITY);
    Tensor gpu = cpu.to(Device::cuda(0));
    Tensor loss = scalar_tensor(0.75);
    EXPECT_EQ(device.scale(loss.to(Device::cuda(0))).item<double>(), host.scale(loss).item<double>());
    const bool found = host.unscale_and_check(std::vector<Tensor>{cpu});
    device.unscale_on_device(std::vector<Tensor>{gpu});
    EXPECT_EQ(found, overflow);
    EXPECT_EQ(device.found_inf().item<double>() != 0, found);
    if (!overflow) expect_close(gpu.to(Device::cpu()), cpu, 0, 0);
    host.update(found);
    device.update_on_device();
    EXPECT_EQ(device.scale(), host.scale());
    EXPECT_EQ(device.growth_tracker(), host.growth_tracker());
    EXPECT_EQ(device.consecutive_overflows(), host.consecutive_overflows());
    EXPECT_EQ(device.skipped_steps(), host.skipped_steps());
  }
  EXPECT_EQ(host.scale(), 24.0) << "the pattern ends at the ceiling";
  EXPECT_EQ(device.state().dump(), host.state().dump());
  amp::GradScaler restored(options);
  restored.keep_on_device(Device::cuda(0));
  restored.load_state(host.state());
  EXPECT_EQ(restored.state().dump(), host.state().dump());
  Tensor loss = scalar_tensor(0.75, DType::f32, Device::cuda(0));
  EXPECT_EQ(restored.scale(loss).item<double>(), 0.75 * 24.0) << "the loss factor follows a loaded state";
}
