// The `precis` command line: one subcommand per job.
#include <algorithm>
#include <iostream>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/usage.h"
#include "core/error.h"
#include "train/exit_codes.h"

namespace {

// The name the usage table knows a command line by: "train", "bench resnet", ...
std::string usage_name(const std::string& command, const precis::cli::Args& rest) {
  if (command == "bench" && !rest.empty() &&
      (rest[0] == "resnet" || rest[0] == "attention" || rest[0] == "gpt2" || rest[0] == "matmul"))
    return "bench " + rest[0];
  return command;
}

int run(const std::vector<std::string>& args) {
  using namespace precis::cli;
  if (args.empty()) {
    std::cerr << overview_usage();
    return 2;
  }
  if (args[0] == "help" || args[0] == "--help" || args[0] == "-h") {
    std::cout << overview_usage();
    return 0;
  }
  if (args[0] == "--version" || args[0] == "version") return version_command();
  const std::string& command = args[0];
  Args rest(args.begin() + 1, args.end());
  const std::string usage = command_usage(usage_name(command, rest));
  if (usage.empty()) usage_fail("precis", "unknown command '" + command + "'; run `precis help` for the list");
  if (std::find_if(rest.begin(), rest.end(), [](const std::string& a) { return a == "--help" || a == "-h"; }) !=
      rest.end()) {
    std::cout << usage;
    return 0;
  }
  if (command == "train") return train_command(rest);
  if (command == "eval") return eval_command(rest);
  if (command == "sample") return sample_command(rest);
  if (command == "plot") return plot_command(rest);
  if (command == "tokenize") return tokenize_command(rest);
  if (command == "device") return device_command(rest);
  if (command == "numerics") return numerics_command(rest);
  if (command == "sweep") return sweep_command(rest);
  if (command == "profile") return profile_command(rest);
  if (command == "formats") return formats_command(rest);
  return bench_command(rest);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(std::vector<std::string>(argv + 1, argv + argc));
  } catch (const precis::train::StoppedRun& e) {
    std::cerr << "error: " << e.what() << "\n";
    return e.exit_code();
  } catch (const precis::cli::UsageError& e) {
    std::cerr << "error: " << e.what();
    return precis::train::kExitUsage;
  } catch (const precis::Error& e) {
    std::cerr << "error: " << e.what() << "\n";
    return precis::train::kExitError;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return precis::train::kExitInternal;
  }
}
