#if PRECIS_WITH_CUDA

#include "distributed/cuda/registered_memory.h"

#include <algorithm>

#include "core/cuda/runtime.h"
#include "distributed/cuda/nccl_check.h"

namespace precis::distributed {

void* RegisteredAllocator::allocate(size_t nbytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  PRECIS_CHECK(comm_, "registered memory: the NCCL communicator is gone; allocate before destroying the group");
  cuda::DeviceGuard guard(device_);
  void* ptr = nullptr;
  PRECIS_NCCL_CHECK(ncclMemAlloc(&ptr, nbytes), "registered memory: ncclMemAlloc");
  void* handle = nullptr;
  const ncclResult_t registered = ncclCommRegister(comm_, ptr, nbytes, &handle);
  if (registered != ncclSuccess) {
    ncclMemFree(ptr);
    PRECIS_NCCL_CHECK(registered, "registered memory: ncclCommRegister");
  }
  handles_[ptr] = handle;
  sizes_[ptr] = nbytes;
  allocated_ += nbytes;
  peak_ = std::max(peak_, allocated_);
  ++allocs_;
  return ptr;
}

bool RegisteredAllocator::owns(const void* base) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return handles_.count(base) > 0;
}

ncclWindow_t RegisteredAllocator::window(const void* base) {
  std::lock_guard<std::mutex> lock(mutex_);
  PRECIS_CHECK(comm_, "registered memory: the NCCL communicator is gone; register windows before destroying the group");
  const auto size = sizes_.find(base);
  PRECIS_CHECK(size != sizes_.end(), "registered memory: ", base, " is not the start of one of its buffers");
  const auto found = windows_.find(base);
  if (found != windows_.end()) return found->second;
  cuda::DeviceGuard guard(device_);
  ncclWindow_t window = nullptr;
  PRECIS_NCCL_CHECK(
      ncclCommWindowRegister(comm_, const_cast<void*>(base), size->second, &window, NCCL_WIN_COLL_SYMMETRIC),
      "registered memory: ncclCommWindowRegister");
  windows_[base] = window;
  return window;
}

void RegisteredAllocator::deallocate(void* ptr, size_t nbytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  cuda::DeviceGuard guard(device_);
  cudaDeviceSynchronize();  // no collective or kernel may still use it
  const auto it = handles_.find(ptr);
  // No throwing from here (a storage's destructor): a failure leaks the buffer.
  const auto window = windows_.find(ptr);
  if (window != windows_.end()) {
    if (comm_) ncclCommWindowDeregister(comm_, window->second);
    windows_.erase(window);
  }
  sizes_.erase(ptr);
  if (it != handles_.end()) {
    if (comm_ && it->second) ncclCommDeregister(comm_, it->second);
    handles_.erase(it);
  }
  ncclMemFree(ptr);
  allocated_ -= nbytes;
  ++frees_;
}

AllocatorStats RegisteredAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  // Every allocation is one from the system (ncclMemAlloc), and nothing is cached.
  return {.allocated_bytes = allocated_,
          .peak_bytes = peak_,
          .reserved_bytes = allocated_,
          .num_allocs = allocs_,
          .num_system_allocs = allocs_,
          .num_system_frees = frees_};
}

void RegisteredAllocator::reset_peak() {
  std::lock_guard<std::mutex> lock(mutex_);
  peak_ = allocated_;
}

void RegisteredAllocator::detach(bool deregister) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!comm_) return;
  cuda::DeviceGuard guard(device_);
  if (deregister)
    for (const auto& [ptr, window] : windows_) ncclCommWindowDeregister(comm_, window);
  windows_.clear();
  for (auto& [ptr, handle] : handles_) {
    if (deregister && handle) ncclCommDeregister(comm_, handle);
    handle = nullptr;
  }
  comm_ = nullptr;
}

}  // namespace precis::distributed

#endif  // PRECIS_WITH_CUDA
