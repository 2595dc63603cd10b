// Runs the built `precis` binary for the command-line tests (tests/cli,
// whose targets define PRECIS_CLI_PATH).
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
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

// Whether python3 runs here (the tests of scripts/*.py skip, saying so, where it does not).
inline bool python_available() { return std::system("python3 --version >/dev/null 2>&1") == 0; }

// The whole file as text (empty, and a failed expectation, when it cannot be opened).
inline std::string read_text_file(const std::filesystem::path& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "cannot open " << path;
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// A tiny char-level run (seconds on the CPU): DIR/tiny.yaml with out_dir DIR/out, where
// DIR = the temporary directory's precis_cli_<name>, made empty. Returns DIR.
inline std::filesystem::path write_tiny_config(const std::string& name) {
  namespace fs = std::filesystem;
  fs::path dir = fs::temp_directory_path() / ("precis_cli_" + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::ofstream(dir / "tiny.yaml") << "model: {n_layer: 1, n_head: 2, n_embd: 16, block_size: 16}\n"
                                      "data: {text_file: assets/tinyshakespeare.txt, tokenizer: char}\n"
                                      "batch: {micro_batch: 2, seq_len: 16}\n"
                                      "sample: {tokens: 8}\n"
                                      "max_steps: 4\neval_interval: 2\neval_steps: 1\nlog_interval: 2\n"
                                      "device: cpu\nout_dir: "
                                   << (dir / "out").string() << "\n";
  return dir;
}

}  // namespace precis::testing
