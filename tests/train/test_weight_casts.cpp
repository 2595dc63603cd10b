// optimizer.writes_weight_casts (on by default): under an autocast policy the optimizer's step
// writes the f16/bf16 casts of the f32 weights that the next forward reads
// (optim::Optimizer::set_compute_copies), and the step's cast pass runs only on the first step
// and after a resume. A run must train exactly as one that casts at every step: the same losses,
// gradient norms and weights bit for bit, with SGD (the tiny ResNet) and AdamW (the tiny GPT),
// and a resumed run must continue exactly as an unbroken one (its casts made anew from the
// checkpoint's weights, not left from before the resume).
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "support/tiny_run.h"
#include "train/trainer.h"

using namespace precis;
namespace fs = std::filesystem;
using precis::testing::TrainedRun;

namespace {

TrainedRun resnet(bool writes_casts, const std::string& precision) {
  return precis::testing::train_tiny_resnet(
      fs::temp_directory_path() / ("precis_weight_casts_resnet_" + precision + (writes_casts ? "_on" : "_off")),
      {"device=cpu", "precision=" + precision, "max_steps=4", "channels_last=true",
       std::string("optimizer.writes_weight_casts=") + (writes_casts ? "true" : "false")});
}

// The tiny GPT under `precision` for `max_steps` (AdamW, clipped), in `dir`, its losses.
std::vector<double> gpt_losses(const fs::path& dir, const std::string& precision, bool writes_casts,
                               std::vector<std::string> overrides) {
  overrides.insert(overrides.end(),
                   {"precision=" + precision, "schedule.decay_steps=6",
                    std::string("optimizer.writes_weight_casts=") + (writes_casts ? "true" : "false")});
  train::Trainer trainer(precis::testing::tiny_run(dir, overrides));
  ::testing::internal::CaptureStdout();
  trainer.run();
  ::testing::internal::GetCapturedStdout();
  return trainer.losses();
}

}  // namespace

TEST(WeightCasts, SgdRunTrainsAsOneThatCastsEachStep) {
  for (const std::string precision : {"bf16", "fp16"}) {
    SCOPED_TRACE(precision);
    const TrainedRun on = resnet(true, precision), off = resnet(false, precision);
    ASSERT_EQ(on.losses.size(), 4u);
    EXPECT_EQ(on.losses, off.losses);
    EXPECT_EQ(on.grad_norms, off.grad_norms);
    for (const auto& [name, values] : off.state) EXPECT_EQ(on.state.at(name), values) << name;
    EXPECT_LT(on.losses.back(), on.losses.front()) << "it learns the fixed batch";
  }
}

TEST(WeightCasts, AdamWRunAndItsResumeTrainAsOnesThatCastEachStep) {
  const fs::path off_dir = precis::testing::empty_temp_dir("weight_casts_gpt_off");
  const fs::path on_dir = precis::testing::empty_temp_dir("weight_casts_gpt_on");
  const fs::path split_dir = precis::testing::empty_temp_dir("weight_casts_gpt_split");
  const std::vector<double> off = gpt_losses(off_dir, "bf16", false, {"max_steps=6"});
  const std::vector<double> on = gpt_losses(on_dir, "bf16", true, {"max_steps=6"});
  ASSERT_EQ(off.size(), 6u);
  EXPECT_EQ(on, off);
  // Three steps, a checkpoint, then a resumed run of the last three.
  gpt_losses(split_dir, "bf16", true, {"max_steps=3"});
  const std::vector<double> resumed = gpt_losses(split_dir, "bf16", true, {"max_steps=6", "checkpoint.resume=true"});
  ASSERT_EQ(resumed.size(), 3u);
  EXPECT_EQ(resumed, std::vector<double>(off.begin() + 3, off.end()));
}
