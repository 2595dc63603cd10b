// precis --version: the version and commit built, and the CUDA libraries this process loaded
// (their versions as they report them at run time, which is what a bug report needs: the
// toolkit a binary was built with and the libraries it meets on a machine can differ).
#include <iostream>
#include <string>

#include "cli/commands.h"
#include "cli/git_commit.h"
#include "core/gpu.h"

#if PRECIS_WITH_CUDA
#include <cuda_runtime_api.h>
#include <cudnn.h>
#include <nccl.h>
#endif

namespace precis::cli {

namespace {

#if PRECIS_WITH_CUDA
// CUDA's encoding: 1000 * major + 10 * minor (12040 -> "12.4").
std::string cuda_version_text(int version) {
  return std::to_string(version / 1000) + "." + std::to_string(version % 1000 / 10);
}
// cuDNN 9 and NCCL 2.9 on: 10000 * major + 100 * minor + patch; before them 1000 * major + ...
std::string library_version_text(size_t version) {
  const size_t major_unit = version >= 10000 ? 10000 : 1000;
  return std::to_string(version / major_unit) + "." + std::to_string(version % major_unit / 100) + "." +
         std::to_string(version % 100);
}
#endif

}  // namespace

int version_command() {
  std::cout << "precis " << PRECIS_VERSION << " (commit " << PRECIS_GIT_COMMIT << ")\n";
#if PRECIS_WITH_CUDA
  int runtime = 0, driver = 0, nccl = 0;
  cudaRuntimeGetVersion(&runtime);
  if (cudaDriverGetVersion(&driver) != cudaSuccess) driver = 0;
  ncclGetVersion(&nccl);
  std::cout << "CUDA runtime " << cuda_version_text(runtime) << ", driver "
            << (driver > 0 ? "supports CUDA " + cuda_version_text(driver) : std::string("not found")) << "\n"
            << "cuDNN " << library_version_text(cudnnGetVersion()) << "\n"
            << "NCCL " << library_version_text(static_cast<size_t>(nccl)) << "\n";
  std::cout << "GPU " << (cuda_device_count() > 0 ? cuda_status() : "none: no GPU (" + cuda_status() + ")") << "\n";
#else
  std::cout << "CUDA none: no GPU (" << cuda_status() << ")\n";
#endif
  return 0;
}

}  // namespace precis::cli
