#include "core/gpu.h"

#include <iostream>

#include "core/error.h"

namespace precis {

#if PRECIS_WITH_CUDA
namespace cuda {
int device_count();  // core/cuda/device_query.cu
int compute_capability(int index);
std::string device_name(int index);
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

std::string cuda_device_name(int index) {
#if PRECIS_WITH_CUDA
  if (index < cuda::device_count()) return cuda::device_name(index);
#endif
  (void)index;
  return "";
}

double peak_tflops(int index, DType compute, bool tf32) {
  struct Peak {
    const char* name_part;
    double half, tf32, fp32;
  };
  // Dense (no sparsity) datasheet figures.
  static const Peak table[] = {
      {"H200", 989.4, 494.7, 66.9},
      {"H100 PCIe", 756.5, 378.0, 51.2},
      {"H100", 989.4, 494.7, 66.9},
      {"A100", 312.0, 156.0, 19.5},
  };
  std::string name = cuda_device_name(index);
  for (const Peak& p : table) {
    if (name.find(p.name_part) == std::string::npos) continue;
    if (compute == DType::f16 || compute == DType::bf16) return p.half;
    return tf32 ? p.tf32 : p.fp32;
  }
  return 0.0;
}

double peak_memory_gbps(int index) {
  // HBM bandwidth of the datasheets: H200 HBM3e, H100 SXM HBM3, H100 PCIe HBM2e, A100 80GB HBM2e.
  static const std::pair<const char*, double> table[] = {
      {"H200", 4800}, {"H100 PCIe", 2000}, {"H100", 3350}, {"A100", 2039}};
  std::string name = cuda_device_name(index);
  for (const auto& [part, gbps] : table)
    if (name.find(part) != std::string::npos) return gbps;
  return 0.0;
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
