// Device query: how many GPUs, and what they are. With no driver (as on the CI
// machines) cudaGetDeviceCount fails with cudaErrorInsufficientDriver; that is
// "no GPU", not an error.
#include <cuda_runtime.h>

#include <sstream>
#include <string>

namespace precis::cuda {

int device_count() {
  static const int count = [] {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
      cudaGetLastError();  // clear the sticky error so later calls start clean
      return 0;
    }
    return n;
  }();
  return count;
}

std::string no_device_reason() {
  int n = 0;
  cudaError_t status = cudaGetDeviceCount(&n);
  cudaGetLastError();
  if (status == cudaErrorInsufficientDriver || status == cudaErrorNoDevice)
    return std::string("no usable GPU: ") + cudaGetErrorString(status);
  if (status != cudaSuccess) return std::string("CUDA unavailable: ") + cudaGetErrorString(status);
  return n == 0 ? "no CUDA device present" : "GPU present";
}

std::string device_name(int index) {
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, index) != cudaSuccess) {
    cudaGetLastError();
    return "";
  }
  return prop.name;
}

int compute_capability(int index) {
  int major = 0, minor = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, index) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, index) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return major * 10 + minor;
}

std::string device_summary(int index) {
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, index) != cudaSuccess) return "unknown GPU";
  std::ostringstream out;
  out << prop.name << " (sm_" << prop.major << prop.minor << ", " << prop.multiProcessorCount << " SMs, "
      << static_cast<double>(prop.totalGlobalMem) / (1 << 30) << " GiB)";
  return out.str();
}

}  // namespace precis::cuda
