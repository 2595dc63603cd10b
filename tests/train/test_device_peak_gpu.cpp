// The MFU denominator: a GPU in the datasheet table gets its datasheet figure
// (no measurement), and a measured matmul rate is positive and, on a known GPU,
// a plausible fraction of the datasheet peak (never above it).
#include <gtest/gtest.h>

#include "core/gpu.h"
#include "support/gpu.h"
#include "train/device_peak.h"

using namespace precis;

TEST(DevicePeakGpu, KnownGpusUseTheTableAndMeasurementsStayBelowIt) {
  PRECIS_SKIP_WITHOUT_GPU();
  Device gpu = Device::cuda(0);
  struct Case {
    DType compute;
    bool tf32;
  };
  for (Case c : {Case{DType::bf16, false}, Case{DType::f16, false}, Case{DType::f32, true}, Case{DType::f32, false}}) {
    SCOPED_TRACE(std::string(dtype_name(c.compute)) + (c.tf32 ? " tf32" : ""));
    double measured = train::measure_matmul_tflops(gpu, c.compute, c.tf32);
    EXPECT_GT(measured, 1.0);
    double datasheet = peak_tflops(0, c.compute, c.tf32);
    if (datasheet == 0) {
      std::cout << cuda_device_name(0) << " is not in the peak table; measured " << measured << " TFLOP/s\n";
      continue;
    }
    EXPECT_DOUBLE_EQ(train::device_peak_tflops(gpu, c.compute, c.tf32), datasheet);
    EXPECT_LT(measured, datasheet * 1.05);
    EXPECT_GT(measured, datasheet * 0.3);
  }
  EXPECT_EQ(train::device_peak_tflops(Device::cpu(), DType::bf16, false), 0.0);
}
