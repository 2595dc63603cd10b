// The stream-aware caching allocator of each GPU: allocator_for(cuda:N) is the
// CachingAllocator of device N. Include only from */cuda/*.cu files or behind
// PRECIS_WITH_CUDA. How it works is told at the top of core/cuda/allocator.cu.
#pragma once

#include <cuda_runtime.h>

#include <mutex>
#include <vector>

#include "core/allocator.h"
#include "core/cuda/block_pool.h"

namespace precis::cuda {

class CachingAllocator final : public Allocator {
 public:
  explicit CachingAllocator(int index);

  // A block on the compute stream, where all our kernels run.
  void* allocate(size_t nbytes) override;
  // A block owned by `stream`: it is reused, after it is freed, by later
  // allocations on that stream only. The stream must outlive the allocator's use
  // of it (ours live as long as the process).
  void* allocate(size_t nbytes, cudaStream_t stream);
  // While `stream` is being captured: a block holding no byte that the capture has
  // handed out before, so that no node captured so far touches it (a library call's
  // workspace whose memset moves to the graph's start, core/cuda/graph_memsets.h).
  // It joins the capture's private pool as any block taken during the capture.
  void* allocate_unused_by_capture(size_t nbytes, cudaStream_t stream);
  void deallocate(void* ptr, size_t nbytes) override;
  Device device() const override { return Device::cuda(index_); }
  AllocatorStats stats() const override;
  void reset_peak() override;

  // Work queued on `stream` (of this device) uses the block holding `ptr`: once
  // the block is freed, it is not reused before that work has completed.
  void record_stream(void* ptr, cudaStream_t stream);
  // Whether `ptr` lies in a block this allocator handed out.
  bool owns(const void* ptr) const;
  // Gives every wholly unused cached segment back to CUDA (cudaFree).
  void empty_cache();
  // The graph captured with id `capture_id` (cudaStreamGetCaptureInfo) has been
  // destroyed: the memory it held returns to the general cache.
  void release_graph_pool(unsigned long long capture_id);

 private:
  void* allocate(size_t nbytes, cudaStream_t stream, bool unused_by_capture);
  void process_events();
  void record_end_of_use(Block* block);
  [[noreturn]] void out_of_memory(size_t nbytes);

  struct EndOfUse {
    cudaEvent_t event;
    StreamId stream;  // the stream it was recorded on
    Block* block;
  };

  int index_;
  mutable std::mutex mutex_;
  BlockPool pool_;
  std::vector<EndOfUse> outstanding_;  // oldest first
  std::vector<cudaEvent_t> spare_events_;
  std::vector<Block*> deferred_;  // freed during a capture, uses on other streams not yet marked
};

// The caching allocator of GPU `device`.
CachingAllocator& caching_allocator(Device device);
// record_stream for whichever GPU's allocator handed out the block holding `ptr`
// (as PyTorch's Tensor.record_stream). Use it when a tensor made on the compute
// stream is read or written on another stream (the comm stream) and may be freed
// before that work is known to be complete.
void record_stream(void* ptr, cudaStream_t stream);
// empty_cache for `device`.
void empty_cache(Device device);

}  // namespace precis::cuda
