// Runs the built `precis` binary for the command-line tests (tests/cli,
// whose targets define PRECIS_CLI_PATH).
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <string>

namespace precis::testing {

struct CliResult {
  int exit_code;
  std::string output;  // stdout and stderr
};

// Runs a shell command line, its stderr with its stdout.
inline CliResult run_command(const std::string& command_line) {
  std::string command = command_line + " 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  EXPECT_NE(pipe, nullptr);
  std::string output;
  std::array<char, 4096> buffer;
  while (size_t n = fread(buffer.data(), 1, buffer.size(), pipe)) output.append(buffer.data(), n);
  int status = pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, output};
}

inline CliResult run_cli(const std::string& args) { return run_command(std::string(PRECIS_CLI_PATH) + " " + args); }

}  // namespace precis::testing
