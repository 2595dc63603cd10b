// The autotuners' timing (core/cuda/timed_runs.h) counts the GPU's time and not the host's:
// work that spends 300 us on the host before a tiny GPU operation times as the operation, and
// work that holds the GPU for 200 us times as 200 us. Skipped, with the reason, where no GPU is.
#include <gtest/gtest.h>

#include "support/gpu.h"

#if PRECIS_WITH_CUDA

#include <cuda_runtime.h>

#include <chrono>

#include "core/cuda/runtime.h"
#include "core/cuda/timed_runs.h"
#include "core/tensor.h"

using namespace precis;

namespace {

void spin_on_host(std::chrono::microseconds how_long) {
  const auto until = std::chrono::steady_clock::now() + how_long;
  while (std::chrono::steady_clock::now() < until) {
  }
}

}  // namespace

TEST(TimedRunsGpu, TheHostsTimeToEnqueueARunIsNotCounted) {
  PRECIS_SKIP_WITHOUT_GPU();
  const Device gpu = Device::cuda(0);
  Tensor buffer = zeros({16}, DType::f32, gpu);
  const cudaStream_t stream = cuda::compute_stream(gpu);
  const float ms = cuda::fastest_run_ms(stream, 3, "test", [&] {
    spin_on_host(std::chrono::microseconds(300));
    PRECIS_CUDA_CHECK(cudaMemsetAsync(buffer.raw_data(), 0, 16 * sizeof(float), stream), "test");
  });
  // The memset alone takes a few microseconds; counting the host's 300 us would give >= 0.3 ms.
  EXPECT_LT(ms, 0.1) << "the timed run counted the host's enqueue time";
}

TEST(TimedRunsGpu, TheGpusTimeIsCounted) {
  PRECIS_SKIP_WITHOUT_GPU();
  const Device gpu = Device::cuda(0);
  const cudaStream_t stream = cuda::compute_stream(gpu);
  const float ms = cuda::fastest_run_ms(stream, 3, "test", [&] { cuda::hold_stream(stream, 200.0, "test"); });
  EXPECT_GE(ms, 0.19);
  EXPECT_LT(ms, 0.35);
}

#else

TEST(TimedRunsGpu, NeedsTheCudaBackend) { GTEST_SKIP() << "this build of Precis has no CUDA backend"; }

#endif
