// Page-locked ("pinned") host memory, which the GPU reads and writes directly,
// so copies from and to it run asynchronously on a stream. Include only from
// */cuda/*.cu files or behind PRECIS_WITH_CUDA; plain C++ uses core/pinned.h.
#pragma once

#include <cuda_runtime.h>

#include "core/allocator.h"
#include "core/device.h"

namespace precis::cuda {

// The caching allocator of pinned host memory (cudaHostAlloc). Needs a GPU.
Allocator& pinned_allocator();
// Work queued on `stream` (of `device`) reads or writes the pinned block holding
// `ptr`: when that block is freed, it is not reused before the work completes.
// Returns false, and records nothing, when `ptr` is not pinned memory of ours.
bool record_pinned_use(const void* ptr, cudaStream_t stream, Device device);
// Whether `ptr` lies in a live block of the pinned allocator.
bool is_pinned_host(const void* ptr);

}  // namespace precis::cuda
