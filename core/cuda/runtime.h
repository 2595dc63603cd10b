// The CUDA runtime pieces every GPU kernel uses: the streams of a device, and
// checked launches. Include only from */cuda/*.cu files or behind PRECIS_WITH_CUDA.
//
// Each device has one compute stream (all kernels of forward, backward and the
// optimizer run on it, in order) and one communication stream (NCCL all-reduces,
// so they overlap the backward pass). Both are created lazily, on first use, with
// a side stream for work the compute stream does not need at once (core/cuda/side_stream.h:
// inside its scope, compute_stream() names the side stream).
// They are non-blocking: they do not wait for the legacy default stream, so
// work on them must not be ordered through synchronous calls like cudaMemcpy
// (use cudaMemcpyAsync on the compute stream).
#pragma once

#include <cuda_runtime.h>

#include <atomic>

#include "core/cuda/cuda_check.h"
#include "core/device.h"

namespace precis::cuda {

// The compute stream of `device` (created on first use, non-blocking w.r.t. the legacy stream),
// or its side stream inside a SideStreamScope of this thread (core/cuda/side_stream.h).
cudaStream_t compute_stream(Device device);
// The communication stream of `device`.
cudaStream_t comm_stream(Device device);
// Makes `device` current for this thread (cudaSetDevice, skipped when it already is).
void set_device(Device device);
// Waits for everything queued on the compute and side streams of `device`.
void synchronize(Device device);
// Whether `stream` is being captured into a CUDA graph.
bool is_capturing(cudaStream_t stream);
// Whether any stream made here (the compute, comm or side stream of any device) is
// being captured. While one is, calls such as cudaMalloc, cudaFree and
// cudaEventQuery would break the capture.
bool any_capture_underway();

// Makes a device current for a scope and restores the previous one.
class DeviceGuard {
 public:
  explicit DeviceGuard(int index) {
    PRECIS_CUDA_CHECK(cudaGetDevice(&previous_), "set device");
    if (previous_ != index) {
      PRECIS_CUDA_CHECK(cudaSetDevice(index), "set device");
      changed_ = true;
    }
  }
  explicit DeviceGuard(Device device) : DeviceGuard(device.index) {}
  ~DeviceGuard() {
    if (changed_) cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
  bool changed_ = false;
};

// Threads per block and blocks for `n` elements with one element per thread.
inline constexpr int kBlockSize = 256;
inline unsigned grid_for(int64_t n, int per_thread = 1) {
  int64_t threads = (n + per_thread - 1) / per_thread;
  return static_cast<unsigned>((threads + kBlockSize - 1) / kBlockSize);
}

// Pauses (true) or resumes programmatic dependent launch (core/cuda/launch.cuh) for the
// launches that follow. A kernel trace pauses it: a kernel scheduled early would be timed
// from its start, its wait for the kernel before it included, and the kernels would overlap
// in the trace. Kernels captured into a CUDA graph keep what they were captured with.
void pause_dependent_launch(bool paused);

// Blocks of `kernel` at `threads` a block (no dynamic shared memory) that one SM holds at
// once: the occupancy calculator's answer, at least 1, asked once per kernel and block size.
int resident_blocks_per_sm(const void* kernel, int threads);

// Attribute kAttribute of `device`, asked once per device (the first 64 devices).
template <cudaDeviceAttr kAttribute>
int cached_device_attribute(Device device, const char* what) {
  static std::atomic<int> cached[64];
  const bool cacheable = device.index >= 0 && device.index < 64;
  int value = cacheable ? cached[device.index].load(std::memory_order_relaxed) : 0;
  if (value == 0) {
    PRECIS_CUDA_CHECK(cudaDeviceGetAttribute(&value, kAttribute, device.index), what);
    if (cacheable) cached[device.index].store(value, std::memory_order_relaxed);
  }
  return value;
}

// The multiprocessors of `device`.
inline int multiprocessor_count(Device device) {
  return cached_device_attribute<cudaDevAttrMultiProcessorCount>(device, "multiprocessor count");
}

// The most shared memory one block of a kernel on `device` may opt in to (bytes).
inline int shared_memory_per_block_optin(Device device) {
  return cached_device_attribute<cudaDevAttrMaxSharedMemoryPerBlockOptin>(device, "shared memory per block");
}

}  // namespace precis::cuda

// After a kernel launch: checks the launch (not the kernel's completion, which
// would need a sync) and names the op.
#define PRECIS_CUDA_CHECK_LAUNCH(op) PRECIS_CUDA_CHECK(cudaGetLastError(), op)
