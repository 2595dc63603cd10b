// `precis <command> --help`, `precis --version` and the exit codes of docs/config.md
// ("Exit codes"): 0 for help, 1 for a user error, 2 for a command line that does not fit.
#include <gtest/gtest.h>

#include <filesystem>

#include "support/cli.h"

namespace {

using precis::testing::CliResult;
CliResult run(const std::string& args) { return precis::testing::run_cli(args); }

const char* kCommands[] = {"train",        "eval",    "sample",     "plot",         "tokenize",
                           "numerics",     "sweep",   "bench gpt2", "bench resnet", "bench attention",
                           "bench matmul", "formats", "device"};

}  // namespace

TEST(CliUsage, EveryCommandPrintsItsUsageForHelpAndExits0) {
  for (const std::string command : kCommands) {
    for (const char* flag : {"--help", "-h"}) {
      CliResult r = run(command + " " + flag);
      EXPECT_EQ(r.exit_code, 0) << command << " " << flag << ": " << r.output;
      EXPECT_EQ(r.output.rfind("usage: precis " + command, 0), 0u) << command << ": " << r.output;
    }
  }
}

TEST(CliUsage, HelpAfterOtherArgumentsOpensNoFile) {
  // `train --help` used to open a config file named --help.
  CliResult r = run("train does-not-exist.yaml --help");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.rfind("usage: precis train CONFIG.yaml", 0), 0u) << r.output;
  EXPECT_EQ(r.output.find("cannot read"), std::string::npos) << r.output;
}

TEST(CliUsage, BareBenchHelpIsTheGpt2Bench) {
  CliResult r = run("bench --help");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.output.rfind("usage: precis bench gpt2", 0), 0u) << r.output;
}

TEST(CliUsage, OverviewListsEveryCommandAndNoArgumentsIsAUsageError) {
  CliResult help = run("help");
  EXPECT_EQ(help.exit_code, 0);
  for (const std::string command : kCommands) EXPECT_NE(help.output.find("  " + command), std::string::npos) << command;
  CliResult none = run("");
  EXPECT_EQ(none.exit_code, 2);
  EXPECT_NE(none.output.find("usage: precis <command>"), std::string::npos) << none.output;
}

TEST(CliUsage, UsageMistakesExit2WithTheCommandsUsage) {
  CliResult option = run("sample ckpt --frobnicate 3");
  EXPECT_EQ(option.exit_code, 2) << option.output;
  EXPECT_EQ(option.output.rfind("error: sample: unknown option --frobnicate\nusage: precis sample CHECKPOINT", 0), 0u)
      << option.output;
  CliResult missing = run("tokenize --tokenizer char only-one-argument");
  EXPECT_EQ(missing.exit_code, 2) << missing.output;
  EXPECT_NE(missing.output.find("usage: precis tokenize"), std::string::npos) << missing.output;
  CliResult no_config = run("train");
  EXPECT_EQ(no_config.exit_code, 2) << no_config.output;
  CliResult not_override = run("train some.yaml max_steps");
  EXPECT_EQ(not_override.exit_code, 2) << not_override.output;
  EXPECT_NE(not_override.output.find("'max_steps' is not an override"), std::string::npos) << not_override.output;
}

TEST(CliUsage, VersionNamesTheReleaseTheCommitAndTheGpuLibraries) {
  CliResult r = run("--version");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.rfind("precis 0.1.0 (commit ", 0), 0u) << r.output;
  EXPECT_EQ(r.output.find("(commit unknown"), std::string::npos) << "built from a git checkout: " << r.output;
#if PRECIS_WITH_CUDA
  for (const char* library : {"CUDA runtime ", "cuDNN ", "NCCL ", "GPU "})
    EXPECT_NE(r.output.find(library), std::string::npos) << library << ": " << r.output;
#endif
  // This test machine may or may not have a GPU; without one, the output says so.
  if (run("device").output.find("-> cpu") != std::string::npos) {
    EXPECT_NE(r.output.find("no GPU"), std::string::npos) << r.output;
  }
}
