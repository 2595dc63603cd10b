// GPU checks of the core runtime: device query, allocation, copies, fill and
// accumulate on the device, each against the CPU. Skipped, with the reason,
// where no GPU is usable.
#include <gtest/gtest.h>

#include "core/copy.h"
#include "core/gpu.h"
#include "core/random.h"
#include "support/gpu.h"
#include "support/gradcheck.h"

using namespace precis;
using precis::testing::expect_close;

TEST(DeviceGpu, AutoFallsBackOrPicksTheGpu) {
  Device d = resolve_device("auto", /*quiet=*/true);
  if (cuda_device_count() == 0) {
    EXPECT_EQ(d, Device::cpu());
    try {
      resolve_device("cuda");
      FAIL() << "device: cuda without a GPU must be an error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("no GPU is usable"), std::string::npos) << e.what();
    }
  } else {
    EXPECT_EQ(d, Device::cuda(0));
  }
}

TEST(DeviceGpu, CopiesRoundTripThroughTheDevice) {
  PRECIS_SKIP_WITHOUT_GPU();
  for (DType dtype : {DType::f32, DType::f64, DType::f16, DType::bf16, DType::i32, DType::i64}) {
    Tensor host = rand({37, 5}, DType::f32).to(dtype);
    Tensor device = host.to(Device::cuda(0));
    EXPECT_TRUE(device.is_cuda());
    expect_close(device.to(Device::cpu()), host, 0, 0);
  }
  // A strided host view and a dtype conversion on the way.
  Tensor host = rand({6, 4}, DType::f64);
  Tensor device = empty({4, 6}, DType::f32, Device::cuda(0));
  copy_(device, host.t());
  expect_close(device.to(Device::cpu()), host.t().to(DType::f32), 0, 0);
}

TEST(DeviceGpu, FillAndAccumulateMatchTheCpu) {
  PRECIS_SKIP_WITHOUT_GPU();
  for (DType dtype : {DType::f32, DType::f16, DType::bf16}) {
    Tensor a = full({1000}, -7.0, DType::f32).to(dtype).to(Device::cuda(0));  // poison
    fill_(a, 1.5);
    expect_close(a.to(Device::cpu()), full({1000}, 1.5, dtype), 0, 0);
    Tensor b = rand({1000}).to(dtype);
    accumulate_(a, b.to(Device::cuda(0)));
    Tensor expected = full({1000}, 1.5, dtype);
    accumulate_(expected, b);
    expect_close(a.to(Device::cpu()), expected, 1e-2, 1e-2);
  }
}

TEST(DeviceGpu, AllocatorCountsBytes) {
  PRECIS_SKIP_WITHOUT_GPU();
  Allocator& alloc = allocator_for(Device::cuda(0));
  size_t before = alloc.stats().allocated_bytes;
  {
    Tensor t = empty({1 << 20}, DType::f32, Device::cuda(0));
    EXPECT_EQ(alloc.stats().allocated_bytes, before + (4u << 20));
  }
  EXPECT_EQ(alloc.stats().allocated_bytes, before);
}
