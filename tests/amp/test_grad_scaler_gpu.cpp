// The GradScaler on the GPU: the device-parameterised cases (amp/grad_scaler_cases.h,
// the same assertions as on the CPU), and the GPU scaler against the CPU one step by step.
#include "amp/grad_scaler_cases.h"
#include "support/gradcheck.h"

using namespace precis;
using precis::testing::expect_close;

namespace grad_scaler_cases {
INSTANTIATE_TEST_SUITE_P(Cuda, GradScalerOn, ::testing::Values(Device::cuda(0)), precis::testing::device_name);
}  // namespace grad_scaler_cases

TEST(GradScalerGpu, UnscaleMatchesTheCpuAndFindsInfAndNan) {
  PRECIS_SKIP_WITHOUT_GPU();
  const amp::GradScalerOptions options{.init_scale = 3.0};  // 1/3 is inexact: rounding must match too
  amp::GradScaler host(options), device(options, Device::cuda(0));
  for (DType dtype : {DType::f32, DType::f16, DType::bf16, DType::f64}) {
    for (int64_t n : {1, 7, 4099, 1 << 20}) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + " n=" + std::to_string(n));
      Generator gen(static_cast<uint64_t>(n));
      Tensor cpu = rand({n}, DType::f32, &gen, -100, 100).to(dtype);
      Tensor gpu = cpu.to(Device::cuda(0));
      device.unscale_({gpu});
      host.unscale_({cpu});
      EXPECT_EQ(device.found_inf().item<double>(), 0.0);
      EXPECT_EQ(host.found_inf().item<double>(), 0.0);
      expect_close(gpu.to(Device::cpu()), cpu, 0, 0);
      for (double bad : {std::numeric_limits<double>::infinity(), std::nan("")}) {
        Tensor poisoned = cpu.clone();
        fill_(poisoned.slice(0, n - 1, n), bad);
        device.unscale_({poisoned.to(Device::cuda(0))});
        EXPECT_EQ(device.found_inf().item<double>(), 1.0);
      }
    }
  }
}

// The GPU scaler against the CPU one, step by step: the same unscaled gradients, found_inf
// flag, scale and counters, through growth, hysteresis, backoff to the floor and the
// ceiling; then its state saved and loaded.
TEST(GradScalerGpu, FollowsTheCpuStateMachine) {
  PRECIS_SKIP_WITHOUT_GPU();
  const amp::GradScalerOptions options{.init_scale = 3.0,  // 1/3 is inexact: the unscale must round alike
                                       .growth_factor = 2.0,
                                       .backoff_factor = 0.25,
                                       .growth_interval = 3,
                                       .min_scale = 0.5,
                                       .max_scale = 24.0,
                                       .hysteresis = 2};
  const Device gpu_device = Device::cuda(0);
  amp::GradScaler host(options), device(options, gpu_device);
  ASSERT_EQ(device.device(), gpu_device);
  ASSERT_TRUE(device.found_inf().is_cuda());
  // Overflow runs of 1 (hysteresis holds), 2 and 5 (backoff, down to the floor), and long clean runs (growth to the
  // ceiling).
  const std::string pattern = "..x.....xx..........xxxxx.......x...............";
  for (size_t step = 0; step < pattern.size(); ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    const bool overflow = pattern[step] == 'x';
    Generator gen(step + 1);
    Tensor cpu = rand({4099}, DType::f32, &gen, -100, 100);
    if (overflow) fill_(cpu.slice(0, 17 * step % 4099, 17 * step % 4099 + 1), step % 2 ? std::nan("") : INFINITY);
    Tensor gpu = cpu.to(gpu_device);
    Tensor loss = scalar_tensor(0.75);
    EXPECT_EQ(device.scale(loss.to(gpu_device)).item<double>(), host.scale(loss).item<double>());
    host.unscale_({cpu});
    device.unscale_({gpu});
    const bool found = host.found_inf().item<double>() != 0;
    EXPECT_EQ(found, overflow);
    EXPECT_EQ(device.found_inf().item<double>() != 0, found);
    if (!overflow) expect_close(gpu.to(Device::cpu()), cpu, 0, 0);
    host.update();
    device.update();
    EXPECT_EQ(device.scale(), host.scale());
    EXPECT_EQ(device.growth_tracker(), host.growth_tracker());
    EXPECT_EQ(device.consecutive_overflows(), host.consecutive_overflows());
    EXPECT_EQ(device.skipped_steps(), host.skipped_steps());
  }
  EXPECT_EQ(host.scale(), 24.0) << "the pattern ends at the ceiling";
  EXPECT_EQ(device.state().dump(), host.state().dump());
  amp::GradScaler restored(options, gpu_device);
  restored.load_state(host.state());
  EXPECT_EQ(restored.state().dump(), host.state().dump());
  Tensor loss = scalar_tensor(0.75, DType::f32, gpu_device);
  EXPECT_EQ(restored.scale(loss).item<double>(), 0.75 * 24.0) << "the loss factor follows a loaded state";
}
