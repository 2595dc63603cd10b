// One run per folder, nothing of an earlier run lost, signals saved (issue 16): each test
// injects the fault (a second run, a restart over a finished run, a kill mid-interval, a
// SIGINT) and checks what is left in the folder and what the message says.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <thread>

#include "core/json.h"
#include "support/errors.h"
#include "support/tiny_run.h"
#include "train/checkpoint.h"
#include "train/config.h"
#include "train/exit_codes.h"
#include "train/interrupt.h"
#include "train/run_folder.h"
#include "train/trainer.h"

using namespace precis;
using namespace precis::train;
using precis::testing::error_of;
using precis::testing::tiny_run;
namespace fs = std::filesystem;

namespace {

#define EXPECT_CONTAINS(text, part) \
  EXPECT_NE(std::string(text).find(part), std::string::npos) << "'" << (part) << "' not in: " << (text)

fs::path scratch_dir(const std::string& name) { return precis::testing::empty_temp_dir("run_folder_" + name); }

std::string read_text(const fs::path& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// The "step" of every row of a metrics file, in order.
std::vector<int64_t> logged_steps(const fs::path& path) {
  std::ifstream in(path);
  std::vector<int64_t> steps;
  for (std::string line; std::getline(in, line);) steps.push_back(Json::parse(line).at("step").as_int());
  return steps;
}

}  // namespace

TEST(RunLock, ASecondHolderGetsAnErrorNamingThePid) {
  fs::path dir = scratch_dir("lock");
  {
    RunLock first(dir.string());
    const std::string message = error_of([&] { RunLock second(dir.string()); });
    EXPECT_CONTAINS(message, "is in use by another run (pid " + std::to_string(::getpid()));
    EXPECT_CONTAINS(message, "another out_dir");
  }
  RunLock again(dir.string());  // released with its holder
}

// A holder killed without any clean-up (as kill -9) leaves the file but not the lock.
TEST(RunLock, ALockOfADeadProcessIsNotInTheWay) {
  fs::path dir = scratch_dir("stale");
  pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    RunLock held(dir.string());
    ::_exit(0);  // no destructor runs
  }
  int status = 0;
  ::waitpid(child, &status, 0);
  ASSERT_TRUE(fs::exists(dir / "run.lock"));
  EXPECT_CONTAINS(read_text(dir / "run.lock"), "pid " + std::to_string(child));
  RunLock mine(dir.string());
}

TEST(RunFolder, ASecondTrainerOnAFolderInUseIsRefused) {
  fs::path dir = scratch_dir("busy");
  RunLock other(dir.string());
  const std::string message = error_of([&] { Trainer trainer(tiny_run(dir, {"max_steps=1"})); });
  EXPECT_CONTAINS(message, "pid " + std::to_string(::getpid()));
}

// A new run where a run left checkpoints: refused (metrics untouched) unless it resumes or overwrites.
TEST(RunFolder, ANewRunOverCheckpointsIsRefusedUnlessResumedOrOverwritten) {
  fs::path dir = scratch_dir("used");
  Trainer(tiny_run(dir, {"max_steps=3"})).run();
  const std::string metrics = read_text(dir / "metrics.jsonl");
  const std::string message = error_of([&] { Trainer trainer(tiny_run(dir, {"max_steps=3"})); });
  EXPECT_CONTAINS(message, "already holds the checkpoints of a run");
  EXPECT_CONTAINS(message, "step_00000003");
  EXPECT_CONTAINS(message, "checkpoint.resume=true");
  EXPECT_CONTAINS(message, "checkpoint.overwrite=true");
  EXPECT_EQ(read_text(dir / "metrics.jsonl"), metrics);
  EXPECT_EQ(resolve_checkpoint((dir / "checkpoints").string()), (dir / "checkpoints" / "step_00000003").string());

  Trainer(tiny_run(dir, {"max_steps=2", "checkpoint.overwrite=true"})).run();
  EXPECT_FALSE(fs::exists(dir / "checkpoints" / "step_00000003")) << "overwrite deletes the old run's checkpoints";
  EXPECT_EQ(logged_steps(dir / "metrics.jsonl"), (std::vector<int64_t>{1, 2})) << "and its logs";
  EXPECT_FALSE(fs::exists(dir / "metrics.jsonl.1"));
}

// A run that left logs but no checkpoint (killed before its first): a new run keeps them aside.
TEST(RunFolder, ANewRunMovesOldLogsAsideInsteadOfTruncatingThem) {
  fs::path dir = scratch_dir("logs_aside");
  Trainer(tiny_run(dir, {"max_steps=3", "checkpoint.save_final=false"})).run();
  const std::string first = read_text(dir / "metrics.jsonl");
  Trainer(tiny_run(dir, {"max_steps=2", "checkpoint.save_final=false"})).run();
  Trainer(tiny_run(dir, {"max_steps=1", "checkpoint.save_final=false"})).run();
  EXPECT_EQ(read_text(dir / "metrics.jsonl.1"), first);
  EXPECT_EQ(logged_steps(dir / "metrics.jsonl.2"), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(logged_steps(dir / "metrics.jsonl"), (std::vector<int64_t>{1}));
}

// A run killed after step 5 with its last checkpoint at step 4 (and a torn last line): the
// resume drops the rows of the steps it redoes, so each step is logged once.
TEST(RunFolder, AResumeDropsTheRowsAfterTheRestoredStep) {
  fs::path dir = scratch_dir("resume");
  Trainer(tiny_run(dir, {"max_steps=5", "checkpoint.interval=2", "checkpoint.save_final=false"})).run();
  ASSERT_EQ(logged_steps(dir / "metrics.jsonl"), (std::vector<int64_t>{1, 2, 3, 4, 5}));
  std::ofstream(dir / "metrics.jsonl", std::ios::app) << "{\"step\": 6, \"lo";
  Trainer(tiny_run(dir, {"max_steps=7", "checkpoint.resume=true"})).run();
  EXPECT_EQ(logged_steps(dir / "metrics.jsonl"), (std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7}));
}

TEST(RunFolder, DropRowsAfterStepKeepsEarlierRowsAndOtherLines) {
  fs::path dir = scratch_dir("drop");
  const fs::path file = dir / "m.jsonl";
  std::ofstream(file) << "{\"step\": 1}\n{\"note\": \"x\"}\n{\"step\": 3}\n{\"step\": 2}\n";
  drop_rows_after_step(file.string(), 2);
  EXPECT_EQ(read_text(file), "{\"step\": 1}\n{\"note\": \"x\"}\n{\"step\": 2}\n");
  drop_rows_after_step((dir / "missing.jsonl").string(), 2);  // nothing to do
  EXPECT_FALSE(fs::exists(dir / "missing.jsonl"));
}

// The resolved config is a fixed point: written, read back and written again it is the same
// text, with presets, refined policies and tokens_per_step resolved.
TEST(ResolvedConfig, ReadsBackIntoTheSameConfig) {
  TrainConfig config = parse_config(R"(
model: {preset: gpt2, n_layer: 2}
data: {train_bin: "data/*.bin"}
precision: {policy: bf16, master_weights: true}
batch: {micro_batch: 2, seq_len: 8, tokens_per_step: 32}
sample: {prompt: "ROMEO:\n  yes: no"}
optimizer: {lr: 0.1}
)");
  const std::string yaml = resolved_config_yaml(config);
  TrainConfig again = parse_config(yaml, {}, "resolved");
  EXPECT_EQ(resolved_config_yaml(again), yaml);
  EXPECT_EQ(again.model.n_layer, 2);
  EXPECT_EQ(again.model.n_embd, 768);
  EXPECT_EQ(again.batch.grad_accum, 2);
  EXPECT_EQ(again.sample.prompt, "ROMEO:\n  yes: no");
  EXPECT_EQ(again.optimizer.lr, 0.1);
  EXPECT_EQ(again.precision.policy.describe(), config.precision.policy.describe());
  EXPECT_EQ(again.data.tokenizer, "gpt2") << "shards are GPT-2 tokens, whatever the default says";
}

TEST(ResolvedConfig, TheTrainerSavesItInTheRunFolder) {
  fs::path dir = scratch_dir("resolved");
  Trainer trainer(tiny_run(dir, {"max_steps=1", "optimizer.lr=0.01"}));
  TrainConfig saved = load_config((dir / "resolved_config.yaml").string());
  EXPECT_EQ(saved.optimizer.lr, 0.01);
  EXPECT_EQ(saved.model.vocab_size, 65) << "the vocabulary the data decided";
  EXPECT_EQ(saved.out_dir, dir.string());
}

// SIGINT mid-run: the step finishes, a checkpoint is written and named, the exit code is 130,
// and the run resumes from that step.
TEST(Signals, SigintWritesACheckpointAndStops) {
  fs::path dir = scratch_dir("sigint");
  Trainer trainer(tiny_run(dir, {"max_steps=100000"}));
  std::thread sender([&] {
    while (!fs::exists(dir / "metrics.jsonl") || fs::file_size(dir / "metrics.jsonl") == 0)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    ::kill(::getpid(), SIGINT);
  });
  int code = 0;
  std::string message;
  try {
    trainer.run();
  } catch (const StoppedRun& e) {
    code = e.exit_code();
    message = e.what();
  }
  sender.join();
  ASSERT_EQ(code, 130);
  const int64_t stopped = trainer.step();
  ASSERT_LT(stopped, 100000);
  const std::string folder = (dir / "checkpoints" / checkpoint_step_name(stopped)).string();
  EXPECT_CONTAINS(message, "interrupted by SIGINT after step " + std::to_string(stopped));
  EXPECT_CONTAINS(message, "checkpoint written to " + folder);
  EXPECT_EQ(resolve_checkpoint((dir / "checkpoints").string()), folder);
  Trainer resumed(tiny_run(dir, {"max_steps=" + std::to_string(stopped + 1), "checkpoint.resume=true"}));
  resumed.run();
  EXPECT_EQ(resumed.losses().size(), 1u) << "it continued from the interrupted step";
}

// The second signal ends the process at once with 128 + the signal (a child process here).
TEST(Signals, ASecondSignalStopsAtOnce) {
  pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    InterruptScope scope;
    ::raise(SIGTERM);
    if (interrupt_signal() != SIGTERM) ::_exit(10);  // the first only asks
    ::raise(SIGINT);
    ::_exit(11);  // not reached
  }
  int status = 0;
  ::waitpid(child, &status, 0);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 130);
}
