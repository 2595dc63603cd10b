// The `precis` command line: one subcommand per job.
#include <iostream>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/gpu.h"

namespace {

void print_usage() {
  std::cout << "usage: precis <command> [args]\n"
               "commands:\n"
               "  device                 show which device `device: auto` would use\n"
               "  help                   this message\n";
}

int run(const std::vector<std::string>& args) {
  if (args.empty() || args[0] == "help" || args[0] == "--help" || args[0] == "-h") {
    print_usage();
    return 0;
  }
  const std::string& command = args[0];
  if (command == "device") {
    precis::Device device = precis::resolve_device("auto", /*quiet=*/true);
    std::cout << "device auto -> " << device << " (" << precis::cuda_status() << ")\n";
    return 0;
  }
  PRECIS_FAIL("unknown command '", command, "'; run `precis help` for the list");
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(std::vector<std::string>(argv + 1, argv + argc));
  } catch (const precis::Error& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
}
