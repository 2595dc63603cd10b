// KernelTrace on a real GPU: a matmul, a layer norm and a host-to-device copy
// show up with their demangled names, the copy's byte count, and times inside
// the window in which they were issued and waited for.
#include <gtest/gtest.h>

#include <algorithm>

#include "core/kernel_trace.h"
#include "core/pinned.h"
#include "core/random.h"
#include "ops/matmul.h"
#include "ops/nn_functional.h"
#include "support/gpu.h"

using namespace precis;

namespace {

bool has_kernel(const std::vector<GpuActivity>& activities, const std::string& part) {
  return std::any_of(activities.begin(), activities.end(), [&](const GpuActivity& a) {
    return a.kind == GpuActivity::Kind::kernel && a.name.find(part) != std::string::npos;
  });
}

}  // namespace

TEST(KernelTraceGpu, RecordsKernelsAndCopiesInsideTheWindow) {
  PRECIS_SKIP_WITHOUT_GPU();
  if (!kernel_trace_available()) GTEST_SKIP() << kernel_trace_unavailable_reason();
  Device gpu = Device::cuda(0);
  Generator generator(1);
  Tensor host = randn({256, 512}, DType::f32, &generator);
  Tensor weight = randn({256}, DType::f32, &generator).to(gpu);
  Tensor bias = randn({256}, DType::f32, &generator).to(gpu);
  ops::matmul(host.to(gpu), host.to(gpu).transpose(0, 1));  // cuBLASLt set up outside the trace
  synchronize(gpu);

  KernelTrace trace;
  trace.start();
  const int64_t window_start = KernelTrace::now_ns();
  Tensor x = host.to(gpu);
  Tensor y = ops::layer_norm(ops::matmul(x, x.transpose(0, 1)), weight, bias);
  std::vector<GpuActivity> activities = trace.stop();
  const int64_t window_end = KernelTrace::now_ns();
  EXPECT_EQ(y.shape(), Shape({256, 256}));

  ASSERT_FALSE(activities.empty());
  EXPECT_TRUE(has_kernel(activities, "gemm") || has_kernel(activities, "Gemm")) << "no cuBLAS kernel";
  EXPECT_TRUE(has_kernel(activities, "layer_norm_forward")) << "no layer norm kernel";
  bool copied = false;
  for (const GpuActivity& a : activities) {
    EXPECT_GE(a.start_ns, window_start) << a.name;
    EXPECT_LE(a.end_ns, window_end) << a.name;
    EXPECT_GT(a.end_ns, a.start_ns) << a.name;
    EXPECT_EQ(a.name.find("_Z"), std::string::npos) << "not demangled: " << a.name;
    if (a.kind == GpuActivity::Kind::memcpy && a.name == "Memcpy HtoD" && a.bytes == 256 * 512 * 4) copied = true;
  }
  EXPECT_TRUE(copied) << "the 512 KiB host-to-device copy is missing";
  EXPECT_TRUE(std::is_sorted(activities.begin(), activities.end(),
                             [](const GpuActivity& a, const GpuActivity& b) { return a.start_ns < b.start_ns; }));

  // Nothing is recorded after stop(), and a second trace works.
  ops::matmul(x, x.transpose(0, 1));
  synchronize(gpu);
  trace.start();
  EXPECT_TRUE(trace.stop().empty());
}
