// The command line's side of issue 16: exit codes that say how a run ended, a SIGTERM that
// saves a checkpoint, and `precis sample` arguments checked instead of silently changed.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "support/cli.h"

namespace fs = std::filesystem;
using precis::testing::run_cli;
using precis::testing::write_tiny_config;

TEST(CliReliability, ADivergedRunExitsWithThreeAndSaysWhy) {
  fs::path dir = write_tiny_config("diverge");
  auto r = run_cli("train " + (dir / "tiny.yaml").string() +
                   " optimizer.lr=1e6 schedule.kind=constant optimizer.grad_clip=0 max_steps=40 log_interval=1 "
                   "max_nonfinite_steps=2 sample.tokens=0");
  EXPECT_EQ(r.exit_code, 3) << r.output;
  EXPECT_NE(r.output.find("error: training stopped at step"), std::string::npos) << r.output;
}

TEST(CliReliability, SampleArgumentsAreCheckedNotChanged) {
  fs::path dir = write_tiny_config("sample_args");
  ASSERT_EQ(run_cli("train " + (dir / "tiny.yaml").string()).exit_code, 0);
  const std::string checkpoint = (dir / "out" / "checkpoints").string();
  struct Case {
    std::string args, message;
  };
  for (const Case& c : {Case{"--tokens 1e9", "sample: --tokens must be an integer in [0, 1000000], got '1e9'"},
                        Case{"--tokens -3", "sample: --tokens must be an integer in [0, 1000000], got '-3'"},
                        Case{"--top-k 1e9", "sample: --top-k must be an integer >= 0, got '1e9'"},
                        Case{"--top-k 1000", "sample: --top-k 1000 is more than the model's 65 tokens"},
                        Case{"--temperature hot", "sample: --temperature must be a number in"},
                        Case{"--seed -1", "sample: --seed must be an integer >= 0, got '-1'"}}) {
    auto r = run_cli("sample " + checkpoint + " --device cpu " + c.args);
    EXPECT_EQ(r.exit_code, 1) << c.args << ": " << r.output;
    EXPECT_NE(r.output.find(c.message), std::string::npos) << c.args << ": " << r.output;
  }
}

// SIGTERM (what Slurm sends) to a running `precis train`: it writes a checkpoint, says where,
// and exits 143; the folder's lock is free again for the resume.
TEST(CliReliability, SigtermSavesACheckpointAndExits143) {
  fs::path dir = write_tiny_config("sigterm");
  const fs::path log = dir / "log.txt";
  pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    const std::string config = (dir / "tiny.yaml").string();
    if (!std::freopen(log.c_str(), "w", stdout) || !std::freopen(log.c_str(), "a", stderr)) ::_exit(99);
    ::execl(PRECIS_CLI_PATH, PRECIS_CLI_PATH, "train", config.c_str(), "max_steps=1000000", "log_interval=1",
            static_cast<char*>(nullptr));
    ::_exit(98);
  }
  const fs::path metrics = dir / "out" / "metrics.jsonl";
  for (int i = 0; i < 3000 && (!fs::exists(metrics) || fs::file_size(metrics) == 0); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ::kill(child, SIGTERM);
  int status = 0;
  ::waitpid(child, &status, 0);
  std::ifstream in(log);
  const std::string output((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_TRUE(WIFEXITED(status)) << output;
  EXPECT_EQ(WEXITSTATUS(status), 143) << output;
  EXPECT_NE(output.find("interrupted by SIGTERM after step"), std::string::npos) << output;
  EXPECT_NE(output.find("checkpoint written to " + (dir / "out" / "checkpoints" / "step_").string()), std::string::npos)
      << output;
  EXPECT_TRUE(fs::exists(dir / "out" / "resolved_config.yaml"));
  auto resumed = run_cli("train " + (dir / "tiny.yaml").string() + " checkpoint.resume=true max_steps=1");
  EXPECT_EQ(resumed.exit_code, 0) << resumed.output;
}
