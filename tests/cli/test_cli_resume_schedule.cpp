// Resuming with a larger max_steps keeps the checkpoint's schedule (train/resume_schedule.h)
// and says so; the learning rates of the resumed steps show it.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>

#include "core/json.h"
#include "support/cli.h"

namespace fs = std::filesystem;

namespace {

// step -> lr from a run's metrics.jsonl
std::map<int64_t, double> logged_lrs(const fs::path& metrics) {
  std::map<int64_t, double> lrs;
  std::ifstream in(metrics);
  for (std::string line; std::getline(in, line);) {
    precis::Json row = precis::Json::parse(line);
    if (row.contains("lr")) lrs[row.at("step").as_int()] = row.at("lr").as_double();
  }
  return lrs;
}

}  // namespace

TEST(CliResumeSchedule, ALargerMaxStepsKeepsTheSavedCosineUnlessDecayStepsIsGiven) {
  fs::path dir = precis::testing::write_tiny_config("resume_schedule");
  const std::string config = (dir / "tiny.yaml").string();
  auto r = precis::testing::run_cli("train " + config + " max_steps=4 log_interval=1 eval_interval=0 sample.tokens=0");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = precis::testing::run_cli("train " + config +
                               " max_steps=6 log_interval=1 eval_interval=0 sample.tokens=0 checkpoint.resume=true");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("schedule: cosine from 0.0006 to 6e-05 at step 4 (the checkpoint's end, not max_steps=6; "
                          "set schedule.decay_steps=6 to stretch it)"),
            std::string::npos)
      << r.output;
  std::map<int64_t, double> lrs = logged_lrs(dir / "out" / "metrics.jsonl");
  ASSERT_TRUE(lrs.count(5) && lrs.count(6));
  EXPECT_DOUBLE_EQ(lrs[5], 6e-5);  // past the saved end: min_lr, not a cosine stretched to 6
  EXPECT_DOUBLE_EQ(lrs[6], 6e-5);

  r = precis::testing::run_cli("train " + config +
                               " max_steps=8 log_interval=1 eval_interval=0 sample.tokens=0 checkpoint.resume=true "
                               "schedule.decay_steps=10");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("schedule: cosine from 0.0006 to 6e-05 at step 10 (the config's; the checkpoint's was "
                          "cosine from 0.0006 to 6e-05 at step 4)"),
            std::string::npos)
      << r.output;
  lrs = logged_lrs(dir / "out" / "metrics.jsonl");
  EXPECT_GT(lrs[7], 6e-5);
}
