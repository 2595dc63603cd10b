// Allocator interface and the CPU allocator (64-byte aligned, with statistics).
// The CUDA caching allocator implements the same interface in core/cuda/.
#pragma once

#include <atomic>
#include <cstddef>

#include "core/device.h"

namespace precis {

struct AllocatorStats {
  size_t allocated_bytes = 0;    // in live allocations now
  size_t graph_pool_bytes = 0;   // free, but kept for captured CUDA graphs: each replay writes them
  size_t peak_bytes = 0;         // most ever live or kept for graphs at once (since reset_peak)
  size_t reserved_bytes = 0;     // held from the system (caching allocators hold more than is live)
  size_t num_allocs = 0;         // allocate() calls
  size_t num_system_allocs = 0;  // allocations from the system (cudaMalloc, cudaHostAlloc, aligned_alloc)
  size_t num_system_frees = 0;   // and returns to it; a warm cache makes neither
};

class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual void* allocate(size_t nbytes) = 0;
  virtual void deallocate(void* ptr, size_t nbytes) = 0;
  virtual Device device() const = 0;
  virtual AllocatorStats stats() const = 0;
  virtual void reset_peak() = 0;
};

class CpuAllocator final : public Allocator {
 public:
  static constexpr size_t kAlignment = 64;
  void* allocate(size_t nbytes) override;
  void deallocate(void* ptr, size_t nbytes) override;
  Device device() const override { return Device::cpu(); }
  AllocatorStats stats() const override;
  void reset_peak() override;

 private:
  std::atomic<size_t> allocated_{0};
  std::atomic<size_t> peak_{0};
  std::atomic<size_t> count_{0};
  std::atomic<size_t> frees_{0};
};

CpuAllocator& cpu_allocator();
// The allocator for a device: the CPU one, or the CUDA caching allocator of that GPU.
Allocator& allocator_for(Device device);

}  // namespace precis
