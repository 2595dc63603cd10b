// The optimizers on the CPU: the device-parameterised cases (optim/optimizer_cases.h; their
// GPU instance is test_optimizers_gpu.cpp), the input checks and the schedule.
#include "optim/lr_schedule.h"
#include "optim/optimizer_cases.h"

using namespace precis;

namespace optimizer_cases {
INSTANTIATE_TEST_SUITE_P(Cpu, OptimizerOn, ::testing::Values(Device::cpu()), precis::testing::device_name);
}  // namespace optimizer_cases

TEST(Optimizer, StepInputsMustBeF64Scalars) {
  Tensor p = tensor({1.0}).set_requires_grad();
  p.set_grad(tensor({1.0}));
  optim::SGD opt({{{p}, 0.0}});
  EXPECT_THROW(opt.step({.skip_if = scalar_tensor(0.0, DType::f32)}), Error);
  EXPECT_THROW(opt.step({.grad_factor = tensor({1.0, 2.0}, DType::f64)}), Error);
  EXPECT_EQ(opt.step_count(), 0);
}

TEST(LrSchedule, WarmupThenCosineToMin) {
  optim::LrSchedule s{"cosine", 1.0, 0.1, 10, 110};
  EXPECT_DOUBLE_EQ(s.at(0), 1.0 / 11);
  EXPECT_DOUBLE_EQ(s.at(9), 10.0 / 11);
  EXPECT_DOUBLE_EQ(s.at(10), 1.0);
  EXPECT_NEAR(s.at(60), 0.55, 1e-12);  // halfway: min + 0.5 (max - min)
  EXPECT_DOUBLE_EQ(s.at(110), 0.1);
  EXPECT_DOUBLE_EQ(s.at(500), 0.1);
  EXPECT_DOUBLE_EQ((optim::LrSchedule{"constant", 0.3}).at(1000), 0.3);
  EXPECT_THROW((optim::LrSchedule{"exponential"}).at(0), Error);
}
