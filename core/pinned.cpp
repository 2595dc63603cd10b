#include "core/pinned.h"

#include "core/gpu.h"

namespace precis {

#if PRECIS_WITH_CUDA
namespace cuda {
// core/cuda/pinned_allocator.cu and core/cuda/runtime.cu.
Allocator& pinned_allocator();
bool is_pinned_host(const void* ptr);
void synchronize(Device device);
}  // namespace cuda
#endif

Tensor empty_pinned(const Shape& shape, DType dtype) {
#if PRECIS_WITH_CUDA
  if (cuda_device_count() > 0) {
    for (int64_t s : shape) PRECIS_CHECK(s >= 0, "empty_pinned: negative size in shape ", shape);
    auto impl = std::make_shared<TensorImpl>();
    impl->storage = std::make_shared<Storage>(shape_numel(shape) * element_size(dtype), cuda::pinned_allocator());
    impl->shape = shape;
    impl->strides = contiguous_strides(shape);
    impl->dtype = dtype;
    return Tensor(std::move(impl));
  }
#endif
  return empty(shape, dtype);
}

bool is_pinned([[maybe_unused]] const Tensor& t) {
#if PRECIS_WITH_CUDA
  return t.is_cpu() && t.storage()->data() != nullptr && cuda_device_count() > 0 &&
         cuda::is_pinned_host(t.storage()->data());
#else
  return false;
#endif
}

void synchronize(Device device) {
  if (device.is_cpu()) return;
#if PRECIS_WITH_CUDA
  cuda::synchronize(device);
#else
  PRECIS_FAIL("synchronize: device ", device, " requested, but this build of Precis has no CUDA backend");
#endif
}

}  // namespace precis
