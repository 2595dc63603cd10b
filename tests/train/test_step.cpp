// The training step on the CPU: the device-parameterised cases (train/step_cases.h; their
// GPU instance is in test_gpu_step_gpu.cpp).
#include "train/step_cases.h"

namespace step_cases {
INSTANTIATE_TEST_SUITE_P(Cpu, StepOn, ::testing::Values(precis::Device::cpu()), precis::testing::device_name);
}  // namespace step_cases
