#include "ops/checks.h"

namespace precis::ops {

Device common_device(const char* op, std::initializer_list<const Tensor*> tensors) {
  const Tensor* first = nullptr;
  for (const Tensor* t : tensors) {
    if (!t->defined()) continue;
    if (!first) first = t;
    PRECIS_CHECK(t->device() == first->device(), op, ": tensors on different devices (", describe(*first), " and ",
                 describe(*t), "); move them to one device with .to(device)");
  }
  return first ? first->device() : Device::cpu();
}

void require_cpu(const char* op, std::initializer_list<const Tensor*> tensors) {
  Device device = common_device(op, tensors);
  PRECIS_CHECK(device.is_cpu(), op, ": no CUDA kernel yet for this op; got tensors on ", device);
}

void require_floating(const char* op, const Tensor& t, const char* what) {
  PRECIS_CHECK(is_floating(t.dtype()), op, ": ", what, " must be a floating tensor, got ", describe(t));
}

void require_defined(const char* op, const Tensor& t, const char* what) {
  PRECIS_CHECK(t.defined(), op, ": ", what, " is an undefined tensor");
}

}  // namespace precis::ops
