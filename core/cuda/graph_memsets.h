// Memset nodes moved out of a captured graph's chain (bench/NOTES.md, thirteenth and fourteenth
// sessions).
//
// cuBLASLt queues a 4-byte memset before every product of GPT-2's whose output has the 16384
// token rows (a counter it keeps in its workspace: 99 of a step's 160 products), cuDNN one
// before some convolutions (about 20 in a ResNet-18 step). In a replayed graph each such node
// breaks the chain of kernels: the product after it cannot start early as it does after one of
// our kernels (launched with PDL), and each costs a few microseconds of gaps.
//
// So while a capture is under way, each library call runs on a workspace slice of its own
// (CaptureWorkspace below): bytes that no node captured before it has touched. When the call
// returns, the memset nodes it queued into the slice are noted and the slice is freed like any
// workspace (later nodes may reuse its bytes: they run after the call). After the capture, a
// call's memset, when it is the only one the call aimed at its slice, is removed: its
// successors take its predecessors, and one kernel at the graph's start zeroes all the removed
// targets before every replay (up to 255 of them; any further memset stays where it is). That
// is safe because no node before the call touches the slice's bytes, and every node after it
// runs before the next replay's start. A new edge between two kernels is programmatic (PDL)
// when the successor's function is one the capture gave a programmatic edge elsewhere: its
// launcher asked for PDL, so it waits for the kernel before it (griddepcontrol.wait). Any other
// edge is plain, and so is every edge with PRECIS_PDL=0.
//
// Include only from files built with PRECIS_WITH_CUDA.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "core/device.h"

namespace precis::cuda {

// On unless a test turned it off (tests/ops/test_memset_hoist_gpu.cpp compares both).
bool memset_hoisting();
void set_memset_hoisting(bool on);

// The workspace of one library call (a cuBLASLt product, a cuDNN convolution) queued on
// `stream` while a capture is under way: a slice that no node of the capture has used
// (CachingAllocator::allocate_unused_by_capture), freed when this object goes, once the call
// is queued; then the memsets the call aimed into the slice are noted for hoist_memsets. Empty
// (data() null) when hoisting is off, no capture is under way on `stream`, or `bytes` is 0 or
// over 1 MiB: the caller then uses its usual workspace.
class CaptureWorkspace {
 public:
  CaptureWorkspace(Device device, cudaStream_t stream, size_t bytes);
  ~CaptureWorkspace();
  CaptureWorkspace(const CaptureWorkspace&) = delete;
  CaptureWorkspace& operator=(const CaptureWorkspace&) = delete;

  void* data() const { return begin_; }

 private:
  Device device_;
  cudaStream_t stream_;
  unsigned long long capture_ = 0;
  char* begin_ = nullptr;
  size_t bytes_ = 0;
};

// Forgets what the capture with id `capture` (cudaStreamGetCaptureInfo) noted, once its graph
// is destroyed or the capture abandoned (CudaGraph does it).
void forget_capture_memsets(unsigned long long capture);

// The hoisting above, on the graph captured with id `capture` (not instantiated yet); returns
// the memset nodes removed (0: the graph is as it was, as it is with hoisting off).
size_t hoist_memsets(cudaGraph_t graph, unsigned long long capture);

}  // namespace precis::cuda
