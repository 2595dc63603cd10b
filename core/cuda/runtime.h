// The CUDA runtime pieces every GPU kernel uses: the streams of a device, and
// checked launches. Include only from */cuda/*.cu files or behind PRECIS_WITH_CUDA.
//
// Each device has one compute stream (all kernels of forward, backward and the
// optimizer run on it, in order) and one communication stream (NCCL all-reduces,
// so they overlap the backward pass). Both are created lazily, on first use.
#pragma once

#include <cuda_runtime.h>

#include "core/cuda/cuda_check.h"
#include "core/device.h"

namespace precis::cuda {

// The compute stream of `device` (created on first use, non-blocking w.r.t. the legacy stream).
cudaStream_t compute_stream(Device device);
// The communication stream of `device`.
cudaStream_t comm_stream(Device device);
// Makes `device` current for this thread (cudaSetDevice, skipped when it already is).
void set_device(Device device);

// Threads per block and blocks for `n` elements with one element per thread.
inline constexpr int kBlockSize = 256;
inline unsigned grid_for(int64_t n, int per_thread = 1) {
  int64_t threads = (n + per_thread - 1) / per_thread;
  return static_cast<unsigned>((threads + kBlockSize - 1) / kBlockSize);
}

}  // namespace precis::cuda

// After a kernel launch: checks the launch (not the kernel's completion, which
// would need a sync) and names the op.
#define PRECIS_CUDA_CHECK_LAUNCH(op) PRECIS_CUDA_CHECK(cudaGetLastError(), op)
