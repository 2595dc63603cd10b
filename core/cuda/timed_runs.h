// Timing GPU work for the autotuners (the matmul algorithms, the convolution engines): the
// fastest of a few runs of it on a stream, timed by CUDA events. Timing waits on the host,
// so never during a CUDA-graph capture. Include only from */cuda/*.cu files.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <limits>

#include "core/cuda/cuda_check.h"

namespace precis::cuda {

// The fastest of `runs` timed runs of `work` on `stream`, in milliseconds, after one untimed
// run (warm-up: first-use costs, any choice made inside the work). `op` names the caller in
// errors; an exception from `work` passes through (the events are released).
template <typename Work>
float fastest_run_ms(cudaStream_t stream, int runs, const char* op, Work&& work) {
  struct Events {
    cudaEvent_t start = nullptr, stop = nullptr;
    ~Events() {
      if (start) cudaEventDestroy(start);
      if (stop) cudaEventDestroy(stop);
    }
  } events;
  PRECIS_CUDA_CHECK(cudaEventCreate(&events.start), op);
  PRECIS_CUDA_CHECK(cudaEventCreate(&events.stop), op);
  work();
  float best = std::numeric_limits<float>::infinity();
  for (int r = 0; r < runs; ++r) {
    PRECIS_CUDA_CHECK(cudaEventRecord(events.start, stream), op);
    work();
    PRECIS_CUDA_CHECK(cudaEventRecord(events.stop, stream), op);
    PRECIS_CUDA_CHECK(cudaEventSynchronize(events.stop), op);
    float ms = 0;
    PRECIS_CUDA_CHECK(cudaEventElapsedTime(&ms, events.start, events.stop), op);
    best = std::min(best, ms);
  }
  return best;
}

}  // namespace precis::cuda
