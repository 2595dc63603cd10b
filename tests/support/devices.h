// Suites parameterised over the device: one API, the same assertions on the CPU and on
// a GPU. Write the cases once (TEST_P on a fixture derived from OnDevice, in a header),
// then instantiate them for the CPU in a test_*.cpp file (runs everywhere) and for the
// GPU in a test_*_gpu.cpp file (the `gpu` label), e.g.
//   INSTANTIATE_TEST_SUITE_P(Cpu, ScalerOn, ::testing::Values(Device::cpu()), precis::testing::device_name);
// The cuda case skips, with the reason, where no GPU is usable.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "core/device.h"
#include "support/gpu.h"

namespace precis::testing {

class OnDevice : public ::testing::TestWithParam<Device> {
 protected:
  void SetUp() override {
    if (GetParam().is_cuda()) PRECIS_SKIP_WITHOUT_GPU();
  }
  Device device() const { return GetParam(); }
};

// "cpu" or "cuda": the case's name suffix.
inline std::string device_name(const ::testing::TestParamInfo<Device>& info) {
  return info.param.is_cuda() ? "cuda" : "cpu";
}

}  // namespace precis::testing
