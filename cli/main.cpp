// The `precis` command line: one subcommand per job.
#include <algorithm>
#include <iostream>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/usage.h"
#include "core/error.h"
#include "distributed/launch.h"
#include "distributed/mpi_runtime.h"
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

// One string, one write: under mpirun another rank's output would cut between the writes of a << chain.
void print_error(const std::string& message) { std::cerr << "error: " + message << std::flush; }

// "rank 1 of 4: " in a run of several ranks, unless `message` names this rank already (the
// watchdog's errors do): which rank failed is the first thing to know, and mpirun's own
// message saying so does not always come through.
std::string rank_prefix(const std::string& message) {
  try {
    const precis::distributed::LaunchInfo launch = precis::distributed::detect_launch();
    if (!launch.distributed()) return "";
    const std::string rank = "rank " + std::to_string(launch.rank) + " of " + std::to_string(launch.world_size);
    return message.find(rank + ":") == std::string::npos ? rank + ": " : "";
  } catch (const std::exception&) {  // a launch the variables contradict: that error is the message already
    return "";
  }
}

// A rank that fails ends the whole job at once (a data-parallel run under mpirun or srun), rather
// than leaving the others to wait for it until their collectives time out. Not for a stopped run
// (a signal, the non-finite rule): every rank stops at the same step, and rank 0 may still be
// writing the checkpoint the others were done with.
int fail(const std::string& message, int exit_code) {
  print_error(rank_prefix(message) + message);
  precis::distributed::abort_job_after_error(exit_code);
  return exit_code;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(std::vector<std::string>(argv + 1, argv + argc));
  } catch (const precis::train::StoppedRun& e) {
    print_error(rank_prefix(e.what()) + e.what() + "\n");
    return e.exit_code();
  } catch (const precis::cli::UsageError& e) {
    return fail(e.what(), precis::train::kExitUsage);
  } catch (const precis::Error& e) {
    return fail(std::string(e.what()) + "\n", precis::train::kExitError);
  } catch (const std::exception& e) {
    return fail(std::string(e.what()) + "\n", precis::train::kExitInternal);
  }
}
