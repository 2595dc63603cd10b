// The GPU unscale-and-check against the CPU one.
#include <gtest/gtest.h>

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
