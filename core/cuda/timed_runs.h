// Timing GPU work for the autotuners (the matmul algorithms, the convolution engines): the
// fastest of a few runs of it on a stream, timed by CUDA events. Timing waits on the host,
// so never during a CUDA-graph capture. Include only from CUDA builds (*/cuda/*.cu files, or
// tests under PRECIS_WITH_CUDA).
//
// GPU time only. An event recorded on an idle stream completes at once, so a run timed right
// after a host wait would also count the host's time to enqueue the run (a cuBLASLt or cuDNN
// call: 5-30 us of host work, as much as a small product's kernel time, and different from one
// algorithm to the next), and the autotuners would choose by that. In a replayed step only the
// GPU's time counts. So the timed runs are queued behind hold_stream, a kernel that keeps the
// stream busy until the host has enqueued them all, and each is timed between its own events,
// back to back.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <limits>
#include <vector>

#include "core/cuda/cuda_check.h"

namespace precis::cuda {

// Keeps `stream` busy for `microseconds` (one GPU thread waiting on the GPU's clock).
void hold_stream(cudaStream_t stream, double microseconds, const char* op);

// The longest hold: a first run that compiled or loaded something took long on the host, and
// timing should not wait on that much longer again (later runs then count some host time).
inline constexpr double kMaxHoldMicroseconds = 2000.0;

// The fastest of `runs` timed runs of `work` on `stream`, in milliseconds, after one untimed
// run (warm-up: first-use costs, any choice made inside the work). `op` names the caller in
// errors; an exception from `work` passes through (the events are released).
template <typename Work>
float fastest_run_ms(cudaStream_t stream, int runs, const char* op, Work&& work) {
  struct Events {
    std::vector<cudaEvent_t> events;
    ~Events() {
      for (cudaEvent_t e : events) cudaEventDestroy(e);
    }
  } owned;
  owned.events.resize(static_cast<size_t>(runs) + 1, nullptr);
  for (cudaEvent_t& e : owned.events) PRECIS_CUDA_CHECK(cudaEventCreate(&e), op);
  const std::vector<cudaEvent_t>& e = owned.events;
  auto elapsed_ms = [&](int r) {
    float ms = 0;
    PRECIS_CUDA_CHECK(cudaEventElapsedTime(&ms, e[r], e[r + 1]), op);
    return ms;
  };
  const auto enqueue_start = std::chrono::steady_clock::now();
  work();
  const double enqueue_us =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - enqueue_start).count();
  PRECIS_CUDA_CHECK(cudaStreamSynchronize(stream), op);
  // Twice the warm-up's enqueue time for each run, and 50 us for the events and the hold's launch.
  hold_stream(stream, std::min(kMaxHoldMicroseconds, 2.0 * runs * enqueue_us + 50.0), op);
  PRECIS_CUDA_CHECK(cudaEventRecord(e[0], stream), op);
  for (int r = 0; r < runs; ++r) {
    work();
    PRECIS_CUDA_CHECK(cudaEventRecord(e[r + 1], stream), op);
  }
  PRECIS_CUDA_CHECK(cudaEventSynchronize(e[runs]), op);
  float best = std::numeric_limits<float>::infinity();
  for (int r = 0; r < runs; ++r) best = std::min(best, elapsed_ms(r));
  return best;
}

}  // namespace precis::cuda
