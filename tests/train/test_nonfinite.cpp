// Non-finite training (issue 16): a step with inf/NaN gradients is skipped under every policy,
// the run stops with a clear error after on_nonfinite's limit, and no checkpoint ever holds a
// non-finite value, so keep_last never pushes out the good ones.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "core/copy.h"
#include "optim/adamw.h"
#include "support/errors.h"
#include "support/tiny_run.h"
#include "train/checkpoint.h"
#include "train/config.h"
#include "train/exit_codes.h"
#include "train/nonfinite.h"
#include "train/safetensors.h"
#include "train/trainer.h"

using namespace precis;
using namespace precis::train;
using precis::testing::error_of;
using precis::testing::tiny_run;
namespace fs = std::filesystem;

namespace {

#define EXPECT_CONTAINS(text, part) \
  EXPECT_NE(std::string(text).find(part), std::string::npos) << "'" << (part) << "' not in: " << (text)

fs::path scratch_dir(const std::string& name) { return precis::testing::empty_temp_dir("nonfinite_" + name); }

models::GPT2Config tiny_model() {
  models::GPT2Config c;
  c.vocab_size = 67;
  c.block_size = 16;
  c.n_layer = 1;
  c.n_head = 2;
  c.n_embd = 8;
  return c;
}

// Every tensor of every checkpoint under `dir` is finite.
void expect_all_checkpoints_finite(const fs::path& dir) {
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (!entry.is_directory()) continue;
    for (const char* file : {"model.safetensors", "train_state.safetensors"})
      for (const auto& [name, t] : read_safetensors((entry.path() / file).string()).tensors)
        EXPECT_EQ(first_nonfinite(t), -1) << entry.path() / file << " " << name;
  }
}

}  // namespace

TEST(FirstNonfinite, FindsTheFirstInfOrNaN) {
  EXPECT_EQ(first_nonfinite(from_vector<float>({1, 2, 3}, {3})), -1);
  EXPECT_EQ(first_nonfinite(from_vector<float>({1, INFINITY, NAN}, {3})), 1);
  EXPECT_EQ(first_nonfinite(from_vector<double>({0, 0, NAN}, {3}).to(DType::bf16)), 2);
  EXPECT_EQ(first_nonfinite(from_vector<int64_t>({1, 2}, {2})), -1) << "integers are always finite";
}

// A NaN weight is never written, and keep_last keeps the good checkpoints it would have pushed out.
TEST(NonfiniteCheckpoint, IsNotWrittenAndTheGoodOnesStay) {
  fs::path dir = scratch_dir("save");
  models::GPT2 model(tiny_model(), 1);
  save_checkpoint(dir.string(), 10, model, nullptr, Json::object(), 1);
  fill_(model.parameters()[3].detach().view({-1}).slice(0, 2, 3), std::nan(""));
  const std::string message = error_of([&] { save_checkpoint(dir.string(), 20, model, nullptr, Json::object(), 1); });
  EXPECT_CONTAINS(message, "not writing step 20");
  EXPECT_CONTAINS(message, "holds inf or NaN (element 2)");
  EXPECT_CONTAINS(message, "step_00000010");
  EXPECT_FALSE(fs::exists(dir / "step_00000020"));
  EXPECT_EQ(resolve_checkpoint(dir.string()), (dir / "step_00000010").string());
  expect_all_checkpoints_finite(dir);
  try {
    save_checkpoint(dir.string(), 20, model, nullptr, Json::object(), 1);
  } catch (const StoppedRun& e) {
    EXPECT_EQ(e.exit_code(), kExitNonFinite);
  }
}

// Damage that keeps the file well-formed (a NaN written into a tensor) is caught on load,
// naming the file and the tensor.
TEST(NonfiniteCheckpoint, ANaNInALoadedTensorIsAnErrorNamingFileAndTensor) {
  fs::path dir = scratch_dir("load");
  models::GPT2 model(tiny_model(), 1);
  const std::string step = save_checkpoint(dir.string(), 1, model, nullptr, Json::object(), 1);
  const std::string file = (fs::path(step) / "model.safetensors").string();
  SafetensorsFile weights = read_safetensors(file);
  fill_(weights.tensors[1].tensor.view({-1}).slice(0, 0, 1), INFINITY);
  write_safetensors(file, weights.tensors, weights.metadata);
  const std::string message = error_of([&] { load_checkpoint(dir.string(), model); });
  EXPECT_CONTAINS(message, file);
  EXPECT_CONTAINS(message, "'" + weights.tensors[1].name + "' holds inf or NaN");
}

// A learning rate of 1e6 without loss scaling (fp32): the run diverges, every later step is
// skipped, and it stops with the non-finite exit code after max_nonfinite_steps of them,
// having written no checkpoint with a non-finite value.
TEST(NonfiniteTraining, DivergedFp32RunStopsWithAClearErrorAndFiniteCheckpoints) {
  fs::path dir = scratch_dir("diverge");
  TrainConfig config =
      tiny_run(dir, {"optimizer.lr=1e6", "schedule.kind=constant", "optimizer.grad_clip=0", "max_steps=40",
                     "max_nonfinite_steps=3", "checkpoint.interval=1", "checkpoint.keep_last=1", "precision=fp32"});
  Trainer trainer(config);
  int code = 0;
  std::string message;
  try {
    trainer.run();
  } catch (const StoppedRun& e) {
    code = e.exit_code();
    message = e.what();
  }
  ASSERT_EQ(code, kExitNonFinite) << "the run must stop, not train on to max_steps";
  EXPECT_LT(trainer.step(), 40);
  EXPECT_CONTAINS(message, "the last 3 steps had an inf or NaN loss or gradient");
  EXPECT_CONTAINS(message, "lower optimizer.lr");
  EXPECT_GE(trainer.scaler().skipped_steps(), 3);
  for (const Tensor& p : trainer.model().parameters()) EXPECT_EQ(first_nonfinite(p), -1) << "skipped steps";
  ASSERT_TRUE(has_checkpoint((dir / "checkpoints").string()));
  expect_all_checkpoints_finite(dir / "checkpoints");
}

// on_nonfinite: skip keeps going to max_steps, skipping (and counting) the bad steps.
TEST(NonfiniteTraining, SkipPolicyRunsToTheEndWithFiniteWeights) {
  fs::path dir = scratch_dir("skip");
  TrainConfig config = tiny_run(dir, {"optimizer.lr=1e6", "schedule.kind=constant", "optimizer.grad_clip=0",
                                      "max_steps=8", "max_nonfinite_steps=2", "on_nonfinite=skip", "precision=bf16"});
  Trainer trainer(config);
  trainer.run();
  EXPECT_EQ(trainer.step(), 8);
  EXPECT_GE(trainer.scaler().skipped_steps(), 2);
  for (const Tensor& p : trainer.model().parameters()) EXPECT_EQ(first_nonfinite(p), -1);
  expect_all_checkpoints_finite(dir / "checkpoints");
}
