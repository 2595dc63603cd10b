// The observability settings: profile.trace / profile.trace_step,
// checkpoint.save_final and cuda_graphs parse with the usual checks, and the
// trainer rejects a trace it cannot write before it trains.
#include <gtest/gtest.h>

#include <filesystem>

#include "core/gpu.h"
#include "core/kernel_trace.h"
#include "support/errors.h"
#include "train/config.h"
#include "train/step_trace.h"
#include "train/trainer.h"

using namespace precis;
namespace fs = std::filesystem;

namespace {

const std::string kData = "data: {text_file: assets/tinyshakespeare.txt}\n";

std::string fresh_dir(const std::string& name) {
  fs::path dir = fs::temp_directory_path() / ("precis_profile_config_" + name);
  fs::remove_all(dir);
  return dir.string();
}

train::TrainConfig tiny_cpu_config(const std::string& out_dir, const std::vector<std::string>& overrides) {
  std::vector<std::string> all = {"out_dir=" + out_dir};
  all.insert(all.end(), overrides.begin(), overrides.end());
  return train::parse_config(R"(
model: {n_layer: 1, n_head: 2, n_embd: 16, block_size: 16}
data: {text_file: assets/tinyshakespeare.txt, tokenizer: char}
batch: {micro_batch: 2, seq_len: 16}
sample: {tokens: 0}
max_steps: 2
eval_interval: 0
log_interval: 1
device: cpu
threads: 2
)",
                             all);
}

}  // namespace

TEST(ProfileConfig, DefaultsTraceNothingSaveTheFinalCheckpointAndUseNoGraphs) {
  train::TrainConfig config = train::parse_config(kData);
  EXPECT_EQ(config.profile.trace, "");
  EXPECT_EQ(config.profile.trace_step, 3);
  EXPECT_EQ(config.profile.trace_steps, 1);
  EXPECT_TRUE(config.checkpoint.save_final);
  EXPECT_FALSE(config.cuda_graphs);
}

TEST(ProfileConfig, ParsesFromTheFileAndOverrides) {
  train::TrainConfig config = train::parse_config(kData +
                                                      "profile:\n  trace: out/step.json\n  trace_step: 7\n"
                                                      "checkpoint: {save_final: false}\ncuda_graphs: true\n",
                                                  {"max_steps=10"});
  EXPECT_EQ(config.profile.trace, "out/step.json");
  EXPECT_EQ(config.profile.trace_step, 7);
  EXPECT_FALSE(config.checkpoint.save_final);
  EXPECT_TRUE(config.cuda_graphs);
  config = train::parse_config(kData, {"profile.trace=t.json", "profile.trace_step=2", "cuda_graphs=false"});
  EXPECT_EQ(config.profile.trace, "t.json");
  EXPECT_EQ(config.profile.trace_step, 2);
  config = train::parse_config(kData, {"max_steps=10", "profile.trace=t.json", "profile.trace_steps=8"});
  EXPECT_EQ(config.profile.trace_steps, 8);  // steps 3 to 10
}

TEST(ProfileConfig, MistakesAreClearErrors) {
  precis::testing::expect_error([] { train::parse_config(kData + "profile: {trace_step: 0}\n", {}, "c.yaml"); },
                                "'profile.trace_step' must be >= 1, got 0");
  precis::testing::expect_error(
      [] { train::parse_config(kData + "profile: {trace: t.json, tracestep: 2}\n", {}, "c.yaml"); },
      "unknown key 'profile.tracestep' (known keys: trace, trace_step, trace_steps)");
  precis::testing::expect_error([] { train::parse_config(kData + "cuda_graphs: maybe\n", {}, "c.yaml"); },
                                "'cuda_graphs' must be true or false, got 'maybe'");
  precis::testing::expect_error(
      [] { train::parse_config(kData + "max_steps: 5\nprofile: {trace: t.json, trace_step: 9}\n", {}, "c.yaml"); },
      "'profile.trace_step' (9) must be <= 'max_steps' (5) so that the traced step runs");
  precis::testing::expect_error(
      [] { train::parse_config(kData + "max_steps: 5\nprofile: {trace: t.json, trace_steps: 4}\n", {}, "c.yaml"); },
      "the traced steps 3 to 6 ('profile.trace_step' and 'profile.trace_steps') must end by 'max_steps' (5) so that "
      "they all run");
  precis::testing::expect_error([] { train::parse_config(kData + "profile: {trace_steps: 0}\n", {}, "c.yaml"); },
                                "'profile.trace_steps' must be >= 1, got 0");
}

TEST(ProfileConfig, UnwritableTracePathFailsBeforeTraining) {
  std::string dir = fresh_dir("unwritable");
  train::TrainConfig config = tiny_cpu_config(dir, {"profile.trace=/no-such-dir/step.json", "profile.trace_step=1"});
  precis::testing::expect_error([&] { train::Trainer trainer(config); },
                                "cannot write profile.trace '/no-such-dir/step.json': No such file or directory");
}

TEST(ProfileConfig, TraceOnTheCpuSaysWhyItCannotRun) {
  std::string dir = fresh_dir("cpu");
  fs::create_directories(dir);
  train::TrainConfig config = tiny_cpu_config(dir, {"profile.trace=" + dir + "/step.json", "profile.trace_step=1"});
  std::string expected = kernel_trace_available() ? "profile.trace records GPU kernels, but this run is on the cpu"
                                                  : "profile.trace: this build of Precis has no";
  precis::testing::expect_error([&] { train::Trainer trainer(config); }, expected);
  EXPECT_FALSE(fs::exists(dir + "/step.json"));
}

TEST(ProfileConfig, SaveFinalFalseWritesNoCheckpoint) {
  std::string dir = fresh_dir("save_final");
  train::Trainer trainer(tiny_cpu_config(dir, {"checkpoint.save_final=false"}));
  trainer.run();
  EXPECT_EQ(trainer.step(), 2);
  EXPECT_FALSE(fs::exists(fs::path(dir) / "checkpoints"));
  EXPECT_TRUE(fs::exists(fs::path(dir) / "metrics.jsonl"));

  std::string saving = fresh_dir("save_final_default");
  train::Trainer default_trainer(tiny_cpu_config(saving, {}));
  default_trainer.run();
  EXPECT_TRUE(fs::exists(fs::path(saving) / "checkpoints" / "latest"));
}

// Each rank of a data-parallel run writes its own trace (train/step_trace.h).
TEST(ProfileConfig, EachRankTracesToItsOwnFile) {
  EXPECT_EQ(train::rank_trace_path("out/step.json", 0), "out/step.json");
  EXPECT_EQ(train::rank_trace_path("out/step.json", 3), "out/step.rank3.json");
  EXPECT_EQ(train::rank_trace_path("out.d/step", 1), "out.d/step.rank1");
  EXPECT_EQ(train::rank_trace_path(".trace", 2), ".trace.rank2");
}
