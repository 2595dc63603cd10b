// What each `precis` command takes: the text `precis <command> --help` prints, the
// overview `precis help` prints, and the error for a command line that does not fit
// (exit code 2, docs/config.md "Exit codes").
#pragma once

#include <string>

#include "core/error.h"

namespace precis::cli {

// A command line that does not fit the command's usage (unknown command or option,
// missing or extra arguments); main() exits 2 for it, 1 for other errors.
class UsageError : public Error {
 public:
  using Error::Error;
};

// The usage of `command` ("train", "bench resnet", ...): its synopsis and what it does;
// empty when there is no such command.
std::string command_usage(const std::string& command);
// Every command's synopsis and one line on what it does.
std::string overview_usage();
// Throws UsageError "<command>: <problem>" followed by the command's usage.
[[noreturn]] void usage_fail(const std::string& command, const std::string& problem);
inline void usage_check(bool ok, const std::string& command, const std::string& problem) {
  if (!ok) usage_fail(command, problem);
}

}  // namespace precis::cli
