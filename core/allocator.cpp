#include "core/allocator.h"

#include <cstdlib>
#include <new>

#include "core/error.h"

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace precis {

namespace {

// A training step frees its activations and gradients and allocates the same sizes again in
// the next step. glibc, left to itself, gives such memory back to the system (blocks over its
// mmap threshold are unmapped; free space at the heap's top is trimmed once over 128 KiB), and
// the next step's allocation faults every page back in, each zeroed by the kernel: thousands
// of page faults a step, a number that varies with where the blocks fell. Keeping it (blocks
// up to 32 MiB from the heap, no trimming) makes a warm step fault no pages. The cost is that
// the process keeps its peak heap, which a training run reaches every step anyway.
void keep_freed_memory() {
#if defined(__GLIBC__)
  mallopt(M_MMAP_THRESHOLD, 32 << 20);  // glibc's largest (HEAP_MAX_SIZE / 2 on 64-bit)
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
#endif
}

}  // namespace

void* CpuAllocator::allocate(size_t nbytes) {
  // aligned_alloc wants a size that is a multiple of the alignment.
  size_t rounded = (nbytes + kAlignment - 1) / kAlignment * kAlignment;
  if (rounded == 0) rounded = kAlignment;
  void* ptr = std::aligned_alloc(kAlignment, rounded);
  PRECIS_CHECK(ptr != nullptr, "out of host memory: could not allocate ", nbytes, " bytes (", allocated_.load(),
               " bytes already in use)");
  size_t now = allocated_.fetch_add(nbytes) + nbytes;
  size_t peak = peak_.load();
  while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
  }
  count_.fetch_add(1);
  return ptr;
}

void CpuAllocator::deallocate(void* ptr, size_t nbytes) {
  std::free(ptr);
  allocated_.fetch_sub(nbytes);
  frees_.fetch_add(1);
}

AllocatorStats CpuAllocator::stats() const {
  AllocatorStats s;
  s.allocated_bytes = allocated_.load();
  s.reserved_bytes = s.allocated_bytes;
  s.peak_bytes = peak_.load();
  s.num_allocs = s.num_system_allocs = count_.load();
  s.num_system_frees = frees_.load();
  return s;
}

void CpuAllocator::reset_peak() { peak_.store(allocated_.load()); }

CpuAllocator& cpu_allocator() {
  static CpuAllocator instance = [] {
    keep_freed_memory();
    return CpuAllocator();
  }();
  return instance;
}

#if !PRECIS_WITH_CUDA
Allocator& allocator_for(Device device) {
  PRECIS_CHECK(device.is_cpu(), "device ", device, " requested, but this build of Precis has no CUDA backend: ",
               "rebuild with the CUDA toolkit installed (-DPRECIS_CUDA=ON) or use device: cpu");
  return cpu_allocator();
}
#endif

}  // namespace precis
