// The GPU allocator behind allocator_for(cuda:N). For now a direct cudaMalloc
// with statistics; the stream-aware caching allocator replaces it in the CUDA
// backend work (DESIGN.md section 5).
#include <atomic>
#include <memory>
#include <mutex>
#include <vector>

#include "core/allocator.h"
#include "core/cuda/cuda_check.h"
#include "core/gpu.h"

namespace precis {

namespace {

class CudaAllocator final : public Allocator {
 public:
  explicit CudaAllocator(int index) : index_(index) {}

  void* allocate(size_t nbytes) override {
    PRECIS_CUDA_CHECK(cudaSetDevice(index_), "cuda allocate");
    void* ptr = nullptr;
    cudaError_t status = cudaMalloc(&ptr, nbytes);
    if (status != cudaSuccess) {
      cudaGetLastError();
      size_t free_bytes = 0, total = 0;
      cudaMemGetInfo(&free_bytes, &total);
      PRECIS_FAIL("CUDA out of memory on cuda:", index_, ": requested ", nbytes, " bytes with ", allocated_.load(),
                  " allocated by Precis and ", free_bytes, " of ", total, " bytes free on the device");
    }
    size_t now = allocated_.fetch_add(nbytes) + nbytes;
    size_t peak = peak_.load();
    while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
    }
    count_.fetch_add(1);
    return ptr;
  }

  void deallocate(void* ptr, size_t nbytes) override {
    cudaFree(ptr);
    allocated_.fetch_sub(nbytes);
  }

  Device device() const override { return Device::cuda(index_); }

  AllocatorStats stats() const override {
    AllocatorStats s;
    s.allocated_bytes = s.reserved_bytes = allocated_.load();
    s.peak_bytes = peak_.load();
    s.num_allocs = count_.load();
    return s;
  }

  void reset_peak() override { peak_.store(allocated_.load()); }

 private:
  int index_;
  std::atomic<size_t> allocated_{0}, peak_{0}, count_{0};
};

}  // namespace

Allocator& allocator_for(Device device) {
  if (device.is_cpu()) return cpu_allocator();
  static std::mutex mutex;
  static std::vector<std::unique_ptr<CudaAllocator>> allocators;
  std::lock_guard<std::mutex> lock(mutex);
  int count = cuda_device_count();
  PRECIS_CHECK(device.index >= 0 && device.index < count, "no GPU ", device, ": ", cuda_status());
  if (allocators.empty()) allocators.resize(count);
  if (!allocators[device.index]) allocators[device.index] = std::make_unique<CudaAllocator>(device.index);
  return *allocators[device.index];
}

}  // namespace precis
