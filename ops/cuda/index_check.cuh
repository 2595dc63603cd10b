// Index checks on the device (embedding indices, cross-entropy targets): a kernel that
// meets an out-of-range index records its position in a one-word flag (the smallest
// position wins, so the report does not depend on thread order), and the launcher reads the
// flag back once after the kernel, instead of a check pass on the host.
#pragma once

#include <cstdint>

#include "core/cuda/runtime.h"
#include "core/cuda/wait_watch.h"
#include "core/tensor.h"
#include "ops/cuda/bad_index.h"

namespace precis::ops::cuda {

// A one-word device flag holding the smallest bad position (atomicMin), ~0 when none; a null
// flag records nothing.
__device__ __forceinline__ void flag_bad_position(unsigned long long* flag, int64_t position) {
  if (flag != nullptr) atomicMin(flag, static_cast<unsigned long long>(position));
}

// `storage` (one 8-byte element on the device) cleared on `stream`, as the kernel's flag. While
// `stream` is being captured into a CUDA graph, null: nothing can be read back there, and a
// memset node would break the chain of PDL-overlapped kernels (core/cuda/graph_memsets.h); the
// kernels then only skip the bad index, which they never read either way.
inline unsigned long long* bad_position_flag(const Tensor& storage, cudaStream_t stream, const char* op) {
  if (precis::cuda::is_capturing(stream)) return nullptr;
  auto* flag = static_cast<unsigned long long*>(storage.raw_data());
  PRECIS_CUDA_CHECK(cudaMemsetAsync(flag, 0xff, sizeof(unsigned long long), stream), op);
  return flag;
}

// Reads the flag back (one copy between two stream synchronisations) and, when set, the
// offending index from `indices` (dense i32/i64 on the device). A null flag (a capture)
// reports nothing.
inline BadIndex read_bad_position(const unsigned long long* flag, const Tensor& indices, cudaStream_t stream,
                                  const char* op) {
  if (flag == nullptr) return {};
  auto copy_back = [&](void* host, const void* device, size_t bytes) {
    // Into pageable memory the copy would wait in the driver for the stream, unwatched
    // (core/cuda/wait_watch.h): the stream is drained first, watched.
    precis::cuda::synchronize_stream(stream, op);
    PRECIS_CUDA_CHECK(cudaMemcpyAsync(host, device, bytes, cudaMemcpyDeviceToHost, stream), op);
    precis::cuda::synchronize_stream(stream, op);
  };
  unsigned long long position = 0;
  copy_back(&position, flag, sizeof(position));
  if (position == ~0ull) return {};
  BadIndex bad{static_cast<int64_t>(position), 0};
  const char* at = static_cast<const char*>(indices.raw_data()) + bad.position * element_size(indices.dtype());
  if (indices.dtype() == DType::i32) {
    int32_t value = 0;
    copy_back(&value, at, sizeof(value));
    bad.value = value;
  } else {
    copy_back(&bad.value, at, sizeof(bad.value));
  }
  return bad;
}

}  // namespace precis::ops::cuda
