// core/cuda/timed_runs.h's stream hold: one GPU thread that waits on the GPU's global timer
// (nanoseconds), sleeping a microsecond between looks, until the hold has passed.
#include <cstdint>

#include "core/cuda/launch.cuh"
#include "core/cuda/runtime.h"
#include "core/cuda/timed_runs.h"

namespace precis::cuda {

namespace {

__device__ __forceinline__ uint64_t global_timer_ns() {
  uint64_t ns;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns));
  return ns;
}

__global__ void hold_kernel(uint64_t nanoseconds) {
  wait_for_previous_grid();
  const uint64_t start = global_timer_ns();
  while (global_timer_ns() - start < nanoseconds) __nanosleep(1000);
}

}  // namespace

void hold_stream(cudaStream_t stream, double microseconds, const char* op) {
  launch(hold_kernel, dim3(1), dim3(1), 0, stream, static_cast<uint64_t>(microseconds * 1000.0));
  PRECIS_CUDA_CHECK_LAUNCH(op);
}

}  // namespace precis::cuda
