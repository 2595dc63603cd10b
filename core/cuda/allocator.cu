// The CUDA caching allocator: the GPU allocator behind allocator_for(cuda:N).
//
// Why cache. cudaMalloc and cudaFree are slow (tens of microseconds to
// milliseconds) and cudaFree waits for the whole device. A training step makes
// and drops thousands of tensors, so asking CUDA each time would stall the GPU.
// Instead, memory taken from cudaMalloc is kept: a freed tensor's block returns
// to a cache and the next request of a fitting size reuses it. After the first
// step or two every request is served from the cache, and the steady state makes
// no cudaMalloc at all (stats().num_system_allocs stops growing).
//
// The pieces.
//   - BlockPool (core/cuda/block_pool.h, plain C++) does the bookkeeping: size
//     classes, segments cut into blocks, best-fit search, splitting, merging of
//     free neighbours, statistics. Read its comment first.
//   - This file gives it CUDA: cudaMalloc/cudaFree for segments, a mutex (tensors
//     are freed from any thread), streams, events and graph capture.
//
// Streams. A block belongs to the stream it was allocated on (the device's
// compute stream for allocate(n)). Freeing needs no synchronisation: the host
// drops a tensor as soon as the last kernel using it is *queued*, and the next
// allocation on the same stream may reuse the block at once, because whatever is
// queued after it on that stream runs after those kernels. When another stream
// uses the block too (the comm stream all-reducing a gradient), that no longer
// holds. record_stream(ptr, stream) notes such a use; when the block is freed,
// an event is recorded on each such stream, and the block is reused only once
// all of them have completed (checked with cudaEventQuery on later requests).
//
// Out of memory. When cudaMalloc fails, the unused cached segments are given
// back and cudaMalloc is tried once more; if it fails again, the error says how
// much was requested, how much Precis has allocated and reserved, and how much
// the device has free.
//
// CUDA graphs. While a stream is being captured, cudaFree and cudaEventQuery
// would break the capture, and so would cudaMalloc under the global capture mode.
// So during a capture requests are served from the cache first (run the work once
// before capturing it, so the cache holds what it needs); a miss takes a new
// segment with cudaMalloc, this thread's capture mode relaxed for that one call
// (cudaMalloc is no stream operation and nothing of it is recorded: the graph just
// keeps the address, as PyTorch's allocator does), and nothing is released on the
// way, even when CUDA is out of memory. Events are neither queried nor recorded.
// (A capture needs more than the eager step it records: blocks it takes from a
// segment of the general pool do not merge back with the general remainder.)
// Blocks allocated during a capture go to the capture's private pool: every replay
// of the graph writes them, so they are not handed to code outside the graph until
// release_graph_pool says it is gone.
#include <algorithm>
#include <vector>

#include "core/cuda/caching_allocator.h"
#include "core/cuda/runtime.h"
#include "core/gpu.h"

namespace precis::cuda {

int device_count();  // core/cuda/device_query.cu

namespace {

// A stream that is being captured, or any capture of ours in progress (in the
// default global capture mode, unsafe calls are refused from every thread).
bool capture_touches(StreamId stream, const std::vector<StreamId>& others) {
  if (any_capture_underway() || is_capturing(static_cast<cudaStream_t>(stream))) return true;
  for (StreamId other : others)
    if (is_capturing(static_cast<cudaStream_t>(other))) return true;
  return false;
}

// This thread's stream-capture mode set to relaxed for a scope (cudaMalloc during a capture), then restored.
class RelaxedCaptureMode {
 public:
  RelaxedCaptureMode() {
    PRECIS_CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode_), "cuda allocate during a graph capture");
  }
  ~RelaxedCaptureMode() { cudaThreadExchangeStreamCaptureMode(&mode_); }
  RelaxedCaptureMode(const RelaxedCaptureMode&) = delete;
  RelaxedCaptureMode& operator=(const RelaxedCaptureMode&) = delete;

 private:
  cudaStreamCaptureMode mode_ = cudaStreamCaptureModeRelaxed;
};

}  // namespace

CachingAllocator::CachingAllocator(int index)
    : index_(index),
      pool_(
          [index](size_t nbytes) -> void* {
            DeviceGuard guard(index);
            void* ptr = nullptr;
            cudaError_t status = cudaMalloc(&ptr, nbytes);
            if (status == cudaErrorMemoryAllocation) {
              cudaGetLastError();  // running out is an answer, not a broken context: clear it
              return nullptr;
            }
            PRECIS_CUDA_CHECK(status, "cuda allocate");
            return ptr;
          },
          [index](void* ptr, size_t) {
            DeviceGuard guard(index);
            PRECIS_CUDA_CHECK(cudaFree(ptr), "cuda free");
          }) {}

void* CachingAllocator::allocate(size_t nbytes) { return allocate(nbytes, compute_stream(device())); }

void* CachingAllocator::allocate(size_t nbytes, cudaStream_t stream) { return allocate(nbytes, stream, false); }

void* CachingAllocator::allocate_unused_by_capture(size_t nbytes, cudaStream_t stream) {
  return allocate(nbytes, stream, true);
}

void* CachingAllocator::allocate(size_t nbytes, cudaStream_t stream, bool unused_by_capture) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  unsigned long long capture_id = 0;
  PRECIS_CUDA_CHECK(cudaStreamGetCaptureInfo(stream, &status, &capture_id), "cuda allocate");
  const bool capturing = status != cudaStreamCaptureStatusNone;
  PRECIS_CHECK(capturing || !unused_by_capture, "allocate_unused_by_capture: no capture is under way on the stream");
  std::lock_guard<std::mutex> lock(mutex_);
  if (!capturing && (!outstanding_.empty() || !deferred_.empty()) && !any_capture_underway()) process_events();
  Block* block =
      pool_.allocate(nbytes, stream, capturing ? capture_id : 0, /*may_grow=*/false, true, unused_by_capture);
  if (block == nullptr && (capturing || any_capture_underway())) {
    RelaxedCaptureMode relaxed;
    block = pool_.allocate(nbytes, stream, capturing ? capture_id : 0, /*may_grow=*/true, /*may_release=*/false,
                           unused_by_capture);
    PRECIS_CHECK(block != nullptr, "CUDA graph capture: a request for ", format_bytes(nbytes), " on cuda:", index_,
                 " cannot be served from the cache, and CUDA has no memory for a new segment (",
                 format_bytes(pool_.stats().reserved_bytes),
                 " reserved; nothing can be given back during a capture). Capture a smaller step, or free memory "
                 "before capturing");
  }
  if (block == nullptr) {
    block = pool_.allocate(nbytes, stream, 0, /*may_grow=*/true);
    if (block == nullptr) out_of_memory(nbytes);
  }
  return block->ptr;
}

void CachingAllocator::deallocate(void* ptr, size_t) {
  std::lock_guard<std::mutex> lock(mutex_);
  Block* block = pool_.find(ptr);
  PRECIS_CHECK(block != nullptr && block->ptr == ptr, "cuda free: ", ptr,
               " was not handed out by the caching allocator of cuda:", index_);
  if (!block->stream_uses.empty()) {
    ++block->pending_events;  // holds the block until its end-of-use events are recorded
    if (capture_touches(block->stream, block->stream_uses)) {
      deferred_.push_back(block);
    } else {
      record_end_of_use(block);
    }
  }
  pool_.free(block);
}

void CachingAllocator::record_end_of_use(Block* block) {
  DeviceGuard guard(index_);
  for (StreamId stream : block->stream_uses) {
    cudaEvent_t event = nullptr;
    if (spare_events_.empty()) {
      PRECIS_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "record_stream");
    } else {
      event = spare_events_.back();
      spare_events_.pop_back();
    }
    PRECIS_CUDA_CHECK(cudaEventRecord(event, static_cast<cudaStream_t>(stream)), "record_stream");
    ++block->pending_events;
    outstanding_.push_back({event, stream, block});
  }
  block->stream_uses.clear();
  pool_.event_done(block);  // drops the hold taken when it was freed
}

void CachingAllocator::process_events() {
  for (Block* block : deferred_) record_end_of_use(block);
  deferred_.clear();
  // Events on one stream complete in order: after the first one not done, that stream's later ones are skipped.
  std::vector<StreamId> busy;
  std::vector<EndOfUse> still_pending;
  for (const EndOfUse& use : outstanding_) {
    bool done = false;
    if (std::find(busy.begin(), busy.end(), use.stream) == busy.end()) {
      cudaError_t status = cudaEventQuery(use.event);
      if (status == cudaErrorNotReady) {
        cudaGetLastError();
        busy.push_back(use.stream);
      } else {
        PRECIS_CUDA_CHECK(status, "cuda allocate: query a record_stream event");
        done = true;
      }
    }
    if (!done) {
      still_pending.push_back(use);
      continue;
    }
    spare_events_.push_back(use.event);
    pool_.event_done(use.block);
  }
  outstanding_ = std::move(still_pending);
}

void CachingAllocator::out_of_memory(size_t nbytes) {
  size_t free_bytes = 0, total_bytes = 0;
  {
    DeviceGuard guard(index_);
    if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) cudaGetLastError();
  }
  const AllocatorStats& stats = pool_.stats();
  PRECIS_FAIL("CUDA out of memory on cuda:", index_, ": tried to allocate ", format_bytes(nbytes), " (", nbytes,
              " bytes); Precis has ", format_bytes(stats.allocated_bytes), " allocated and ",
              format_bytes(stats.reserved_bytes), " reserved by its caching allocator, and the device has ",
              format_bytes(free_bytes), " free of ", format_bytes(total_bytes),
              ". Reduce the batch size or the sequence length, or drop tensors that are no longer needed");
}

AllocatorStats CachingAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return pool_.stats();
}

void CachingAllocator::reset_peak() {
  std::lock_guard<std::mutex> lock(mutex_);
  pool_.reset_peak();
}

void CachingAllocator::record_stream(void* ptr, cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(mutex_);
  Block* block = pool_.find(ptr);
  PRECIS_CHECK(block != nullptr, "record_stream: ", ptr, " is not in a live block of cuda:", index_,
               "'s caching allocator");
  if (stream == block->stream) return;
  if (std::find(block->stream_uses.begin(), block->stream_uses.end(), stream) == block->stream_uses.end())
    block->stream_uses.push_back(stream);
}

bool CachingAllocator::owns(const void* ptr) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return pool_.find(ptr) != nullptr;
}

void CachingAllocator::empty_cache() {
  std::lock_guard<std::mutex> lock(mutex_);
  PRECIS_CHECK(!any_capture_underway(), "empty_cache: a CUDA graph is being captured on cuda:", index_,
               "; free the cache before or after the capture");
  process_events();
  pool_.release_cached();
}

void CachingAllocator::release_graph_pool(unsigned long long capture_id) {
  std::lock_guard<std::mutex> lock(mutex_);
  pool_.release_graph(capture_id);
}

CachingAllocator& caching_allocator(Device device) {
  // One allocator per GPU, made at first use and never destroyed: tensors freed
  // during static destruction must still find theirs.
  static const std::vector<CachingAllocator*>* allocators = [] {
    auto* all = new std::vector<CachingAllocator*>;
    for (int i = 0; i < device_count(); ++i) all->push_back(new CachingAllocator(i));
    return all;
  }();
  PRECIS_CHECK(device.is_cuda() && device.index >= 0 && device.index < static_cast<int>(allocators->size()), "no GPU ",
               device, ": ", cuda_status());
  return *(*allocators)[device.index];
}

void record_stream(void* ptr, cudaStream_t stream) {
  for (int i = 0; i < device_count(); ++i) {
    CachingAllocator& allocator = caching_allocator(Device::cuda(i));
    if (allocator.owns(ptr)) return allocator.record_stream(ptr, stream);
  }
  PRECIS_FAIL("record_stream: ", ptr, " is not GPU memory from Precis' caching allocator");
}

void empty_cache(Device device) { caching_allocator(device).empty_cache(); }

}  // namespace precis::cuda

namespace precis {

Allocator& allocator_for(Device device) {
  if (device.is_cpu()) return cpu_allocator();
  return cuda::caching_allocator(device);
}

}  // namespace precis
