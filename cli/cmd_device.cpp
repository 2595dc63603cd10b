#include <iostream>

#include "cli/commands.h"
#include "core/gpu.h"

namespace precis::cli {

int device_command(const Args&) {
  Device device = resolve_device("auto", /*quiet=*/true);
  std::cout << "device auto -> " << device << " (" << cuda_status() << ")\n";
  return 0;
}

}  // namespace precis::cli
