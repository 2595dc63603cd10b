#include "core/gpu.h"

#include <iostream>

#include "core/error.h"

namespace precis {

#if PRECIS_WITH_CUDA
namespace cuda {
int device_count();          // core/cuda/device_query.cu
int compute_capability(int index);
std::string device_summary(int index);
std::string no_device_reason();
}  // namespace cuda
#endif

int cuda_device_count() {
#if PRECIS_WITH_CUDA
  return cuda::device_count();
#else
  return 0;
#endif
}

int cuda_compute_capability(int index) {
#if PRECIS_WITH_CUDA
  return index < cuda::device_count() ? cuda::compute_capability(index) : 0;
#else
  (void)index;
  return 0;
#endif
}

std::string cuda_status() {
#if PRECIS_WITH_CUDA
  if (cuda::device_count() > 0) return cuda::device_summary(0);
  return cuda::no_device_reason();
#else
  return "this build of Precis has no CUDA backend (configured without the CUDA toolkit)";
#endif
}

Device resolve_device(const std::string& setting, bool quiet) {
  if (setting == "cpu") return Device::cpu();
  if (setting == "auto") {
    if (cuda_device_count() > 0) return Device::cuda(0);
    if (!quiet) std::cerr << "note: device auto -> cpu (" << cuda_status() << ")\n";
    return Device::cpu();
  }
  Device device = Device::parse(setting);
  int count = cuda_device_count();
  PRECIS_CHECK(count > 0, "device '", setting, "' requested but no GPU is usable: ", cuda_status(),
               ". Use device: auto or device: cpu");
  PRECIS_CHECK(device.index < count, "device '", setting, "' requested but only ", count, " GPU(s) are present");
  return device;
}

}  // namespace precis
