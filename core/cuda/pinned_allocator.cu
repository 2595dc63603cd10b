// The pinned host allocator. cudaHostAlloc is slow (it locks and maps the pages
// for the GPU: milliseconds for large buffers) and cudaFreeHost waits for the
// device, so freed blocks are kept, by size rounded up to a power of two as
// PyTorch's CachingHostAllocator does, and reused.
//
// A pinned buffer may still be read or written by an asynchronous copy when the
// host drops it. copy_ notes each such use (record_pinned_use); when the block is
// freed, an event is recorded on each stream that used it, and the block is
// reused only once those events have completed. A block used by a copy captured
// into a CUDA graph is never reused (nor freed): every replay copies from or to it.
#include <algorithm>
#include <map>
#include <mutex>
#include <vector>

#include "core/cuda/block_pool.h"
#include "core/cuda/pinned_allocator.h"
#include "core/cuda/runtime.h"

namespace precis::cuda {

namespace {

struct PinnedBlock {
  size_t size = 0;
  bool allocated = false;
  bool captured = false;  // used by a copy captured into a graph
  int pending_events = 0;
  std::vector<std::pair<cudaStream_t, int>> uses;  // streams that used it, with their device
};

size_t pinned_size(size_t nbytes) {
  size_t size = kMinBlockSize;
  while (size < nbytes) size *= 2;
  return size;
}

class PinnedAllocator final : public Allocator {
 public:
  void* allocate(size_t nbytes) override {
    PRECIS_CHECK(nbytes <= kMaxRequest, "pinned allocate: ", nbytes, " bytes is beyond any host memory");
    size_t size = pinned_size(nbytes);
    std::lock_guard<std::mutex> lock(mutex_);
    const bool capture = any_capture_underway();
    if (!outstanding_.empty() && !capture) process_events();
    char* ptr = nullptr;
    if (auto it = free_.find(size); it != free_.end()) {
      ptr = it->second;
      free_.erase(it);
    } else {
      PRECIS_CHECK(!capture, "pinned allocate: no cached block of ", format_bytes(size),
                   ", and no pinned memory can be taken from CUDA while a CUDA graph is being captured; ",
                   "allocate pinned buffers before the capture");
      ptr = system_alloc(size);
      if (ptr == nullptr) {
        release_cached();
        ptr = system_alloc(size);
      }
      PRECIS_CHECK(ptr != nullptr, "out of pinned host memory: tried to allocate ", format_bytes(size), " with ",
                   format_bytes(stats_.reserved_bytes), " pinned already (", format_bytes(stats_.allocated_bytes),
                   " in use); use smaller batches or fewer prefetched batches");
      blocks_[ptr].size = size;
      stats_.reserved_bytes += size;
      ++stats_.num_system_allocs;
    }
    blocks_[ptr].allocated = true;
    stats_.allocated_bytes += size;
    stats_.peak_bytes = std::max(stats_.peak_bytes, stats_.allocated_bytes);
    ++stats_.num_allocs;
    return ptr;
  }

  void deallocate(void* raw, size_t) override {
    char* ptr = static_cast<char*>(raw);
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = blocks_.find(ptr);
    PRECIS_CHECK(it != blocks_.end() && it->second.allocated, "pinned free: ", raw,
                 " was not handed out by the pinned allocator");
    PinnedBlock& block = it->second;
    block.allocated = false;
    stats_.allocated_bytes -= block.size;
    bool captured = block.captured;
    for (auto [stream, device] : block.uses) captured = captured || is_capturing(stream);
    if (captured || (!block.uses.empty() && any_capture_underway())) {
      // A graph may still copy from or to it: leave it to the graph.
      stats_.reserved_bytes -= block.size;
      blocks_.erase(it);
      return;
    }
    for (auto [stream, device] : block.uses) {
      DeviceGuard guard(device);
      cudaEvent_t event = nullptr;
      PRECIS_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "pinned free");
      PRECIS_CUDA_CHECK(cudaEventRecord(event, stream), "pinned free");
      ++block.pending_events;
      outstanding_.push_back({event, ptr});
    }
    block.uses.clear();
    if (block.pending_events == 0) free_.emplace(block.size, ptr);
  }

  Device device() const override { return Device::cpu(); }

  AllocatorStats stats() const override {
    std::lock_guard<std::mutex> lock(mutex_);
    return stats_;
  }

  void reset_peak() override {
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.peak_bytes = stats_.allocated_bytes;
  }

  bool record_use(const void* ptr, cudaStream_t stream, Device device) {
    std::lock_guard<std::mutex> lock(mutex_);
    PinnedBlock* block = find(ptr);
    if (block == nullptr) return false;
    if (is_capturing(stream)) {
      block->captured = true;
    } else if (std::find(block->uses.begin(), block->uses.end(), std::pair(stream, device.index)) ==
               block->uses.end()) {
      block->uses.push_back({stream, device.index});
    }
    return true;
  }

  bool owns(const void* ptr) {
    std::lock_guard<std::mutex> lock(mutex_);
    return find(ptr) != nullptr;
  }

 private:
  struct EndOfUse {
    cudaEvent_t event;
    char* ptr;
  };

  // The live block holding `ptr`, or nullptr.
  PinnedBlock* find(const void* ptr) {
    auto it = blocks_.upper_bound(static_cast<char*>(const_cast<void*>(ptr)));
    if (it == blocks_.begin()) return nullptr;
    --it;
    bool inside = static_cast<const char*>(ptr) < it->first + it->second.size;
    return inside && it->second.allocated ? &it->second : nullptr;
  }

  char* system_alloc(size_t size) {
    void* ptr = nullptr;
    cudaError_t status = cudaHostAlloc(&ptr, size, cudaHostAllocPortable);
    if (status == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      return nullptr;
    }
    PRECIS_CUDA_CHECK(status, "pinned allocate");
    return static_cast<char*>(ptr);
  }

  void release_cached() {
    for (auto [size, ptr] : free_) {
      PRECIS_CUDA_CHECK(cudaFreeHost(ptr), "pinned free");
      blocks_.erase(ptr);
      stats_.reserved_bytes -= size;
      ++stats_.num_system_frees;
    }
    free_.clear();
  }

  void process_events() {
    std::vector<EndOfUse> still_pending;
    for (const EndOfUse& use : outstanding_) {
      cudaError_t status = cudaEventQuery(use.event);
      if (status == cudaErrorNotReady) {
        cudaGetLastError();
        still_pending.push_back(use);
        continue;
      }
      PRECIS_CUDA_CHECK(status, "pinned allocate: query a copy's event");
      PRECIS_CUDA_CHECK(cudaEventDestroy(use.event), "pinned allocate");
      PinnedBlock& block = blocks_.at(use.ptr);
      if (--block.pending_events == 0 && !block.allocated) free_.emplace(block.size, use.ptr);
    }
    outstanding_ = std::move(still_pending);
  }

  mutable std::mutex mutex_;
  std::map<char*, PinnedBlock> blocks_;  // every block held, by address
  std::multimap<size_t, char*> free_;    // cached free blocks, by size
  std::vector<EndOfUse> outstanding_;
  AllocatorStats stats_;
};

PinnedAllocator& pinned() {
  static PinnedAllocator* allocator = new PinnedAllocator;  // never destroyed: see core/cuda/allocator.cu
  return *allocator;
}

}  // namespace

Allocator& pinned_allocator() { return pinned(); }

bool record_pinned_use(const void* ptr, cudaStream_t stream, Device device) {
  return pinned().record_use(ptr, stream, device);
}

bool is_pinned_host(const void* ptr) { return pinned().owns(ptr); }

}  // namespace precis::cuda
