// The training step end to end, parameterised over the device (tests/support/devices.h):
// the same config and assertions on the CPU (test_step.cpp) and on the GPU
// (test_gpu_step_gpu.cpp, where the step is captured into a CUDA graph and replayed).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "support/devices.h"
#include "train/config.h"
#include "train/trainer.h"

namespace step_cases {

using namespace precis;

class StepOn : public precis::testing::OnDevice {
 protected:
  // A tiny char-level GPT-2 on `device()` (CUDA graphs on on a GPU), logging every step.
  train::TrainConfig config(const std::string& name, std::vector<std::string> overrides) const {
    const std::string dir =
        (std::filesystem::temp_directory_path() / ("precis_step_" + name + "_" + (device().is_cuda() ? "cuda" : "cpu")))
            .string();
    std::filesystem::remove_all(dir);
    overrides.push_back("out_dir=" + dir);
    overrides.push_back(std::string("device=") + (device().is_cuda() ? "cuda" : "cpu"));
    overrides.push_back(std::string("cuda_graphs=") + (device().is_cuda() ? "true" : "false"));
    return train::parse_config(R"(
model: {n_layer: 2, n_head: 2, n_embd: 32, block_size: 32, dropout: 0.0}
data: {text_file: assets/tinyshakespeare.txt, tokenizer: char}
optimizer: {lr: 3.0e-3, beta2: 0.99, weight_decay: 0.1, grad_clip: 1.0}
schedule: {kind: cosine, warmup_steps: 2, min_lr: 1.0e-4}
batch: {micro_batch: 4, seq_len: 32, grad_accum: 2}
sample: {tokens: 0}
checkpoint: {save_final: false}
eval_interval: 0
log_interval: 1
threads: 2
)",
                               overrides);
  }
};

// SGD has the same step as AdamW on both devices (and is captured into a graph on a GPU).
TEST_P(StepOn, SgdWithMomentumLearns) {
  train::Trainer trainer(config("sgd", {"max_steps=16", "optimizer.name=sgd", "optimizer.lr=0.3",
                                        "optimizer.momentum=0.9", "optimizer.weight_decay=0"}));
  trainer.run();
  const std::vector<double>& losses = trainer.losses();
  ASSERT_EQ(losses.size(), 16u);
  for (double loss : losses) ASSERT_TRUE(std::isfinite(loss));
  const double last_four = (losses[12] + losses[13] + losses[14] + losses[15]) / 4;  // SGD's curve is noisy
  EXPECT_LT(last_four, losses.front() - 0.3) << "the model learns";
  for (const train::StepReport& r : trainer.reports()) EXPECT_TRUE(std::isfinite(r.grad_norm)) << r.step;
  EXPECT_EQ(trainer.replaying_graph(), device().is_cuda());
}

// A loss scale of 2^24 that doubles after every clean step keeps running into fp16's range:
// overflow steps are skipped (norm +inf, counted) and back the scale off, clean steps train.
TEST_P(StepOn, Fp16OverflowsAreSkippedCountedAndBackOffTheScale) {
  train::Trainer trainer(config("fp16", {"max_steps=12", "precision.policy=fp16", "precision.loss_scale=16777216",
                                         "precision.growth_interval=1"}));
  trainer.run();
  const std::vector<train::StepReport>& reports = trainer.reports();
  ASSERT_EQ(reports.size(), 12u);
  int64_t skipped = 0;
  for (size_t i = 0; i < reports.size(); ++i) {
    SCOPED_TRACE("step " + std::to_string(reports[i].step));
    ASSERT_TRUE(reports[i].loss_scale.has_value());
    const int64_t before = i == 0 ? 0 : reports[i - 1].skipped_steps;
    const double scale_before = i == 0 ? 16777216.0 : *reports[i - 1].loss_scale;
    const bool overflowed = reports[i].skipped_steps == before + 1;
    ASSERT_TRUE(overflowed || reports[i].skipped_steps == before);
    if (overflowed) {
      EXPECT_TRUE(std::isinf(reports[i].grad_norm));
      EXPECT_EQ(*reports[i].loss_scale, scale_before / 2);
    } else {
      EXPECT_TRUE(std::isfinite(reports[i].grad_norm));
      EXPECT_EQ(*reports[i].loss_scale, std::min(scale_before * 2, 16777216.0));
    }
    skipped += overflowed;
  }
  EXPECT_GT(skipped, 0);
  EXPECT_LT(skipped, 12);
  for (double loss : trainer.losses()) EXPECT_TRUE(std::isfinite(loss));
}

}  // namespace step_cases
