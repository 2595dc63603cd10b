// Mixed precision converging as fp32 does, over the whole `make demo` run on the CPU (minutes
// each: label `slow`, which `make test` leaves out and CI runs). f16/bf16 tensors are stored
// in 16 bits and computed in f32 with rounding on every store, as on a GPU.
#include <gtest/gtest.h>

#include <cmath>

#include "support/demo_config.h"
#include "train/trainer.h"

using namespace precis;
using test::demo_config;

TEST(PrecisionTraining, Fp16WithDynamicScalingMatchesFp32AfterTheDemo) {
  train::Trainer fp32(demo_config("fp32", {"precision=fp32"}));
  fp32.run();
  train::Trainer fp16(demo_config("fp16", {"precision=fp16"}));
  fp16.run();
  double a = fp32.final_val_loss(), b = fp16.final_val_loss();
  ASSERT_TRUE(std::isfinite(a) && std::isfinite(b));
  EXPECT_LT(a, 2.1) << "the demo's validation loss falls well below the uniform 4.17";
  EXPECT_LE(std::abs(b - a) / a, 0.03) << "fp32 " << a << ", fp16 " << b;
  EXPECT_GT(fp16.scaler().scale(), 1.0);
}

TEST(PrecisionTraining, Bf16PureConverges) {
  train::Trainer pure(demo_config("bf16_pure", {"precision=bf16-pure", "max_steps=150", "eval_interval=150"}));
  pure.run();
  EXPECT_EQ(pure.gpt2().wte().dtype(), DType::bf16);
  EXPECT_LT(pure.final_val_loss(), 2.7) << "from 4.17 (uniform over 65 chars)";
}
