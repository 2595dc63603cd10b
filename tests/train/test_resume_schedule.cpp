// Which schedule a resumed run follows (train/resume_schedule.h): the checkpoint's end
// unless the config sets decay_steps; every other setting the config's.
#include <gtest/gtest.h>

#include "train/resume_schedule.h"

namespace precis::train {
namespace {

const optim::LrSchedule kSaved{"cosine", 6e-4, 6e-5, 10, 1000, 0.2};

TEST(ResumeSchedule, ANewMaxStepsDoesNotStretchTheSavedSchedule) {
  optim::LrSchedule configured = kSaved;
  configured.decay_steps = 5000;  // max_steps was raised from 1000
  ResumedSchedule r = resumed_schedule(configured, /*decay_steps_from_max_steps=*/true, kSaved);
  EXPECT_EQ(r.schedule, kSaved);
  EXPECT_EQ(r.line,
            "schedule: cosine from 0.0006 to 6e-05 at step 1000 after 10 warmup steps (the checkpoint's end, not "
            "max_steps=5000; set schedule.decay_steps=5000 to stretch it)");
  // A cosine at step 1500 of a run stretched to 5000 would be back near lr; the kept one is at min_lr.
  EXPECT_DOUBLE_EQ(r.schedule.at(1500), 6e-5);
  EXPECT_GT(configured.at(1500), 4e-4);
}

TEST(ResumeSchedule, AnExplicitDecayStepsOrOtherSettingIsTheConfigs) {
  optim::LrSchedule configured = kSaved;
  configured.decay_steps = 5000;
  ResumedSchedule explicit_end = resumed_schedule(configured, /*decay_steps_from_max_steps=*/false, kSaved);
  EXPECT_EQ(explicit_end.schedule, configured);
  EXPECT_NE(explicit_end.line.find("(the config's; the checkpoint's was cosine from 0.0006 to 6e-05 at step 1000"),
            std::string::npos)
      << explicit_end.line;

  optim::LrSchedule lower = kSaved;
  lower.lr = 3e-4;
  lower.decay_steps = 2000;  // from a new max_steps: the end is kept, the new lr taken
  ResumedSchedule r = resumed_schedule(lower, /*decay_steps_from_max_steps=*/true, kSaved);
  EXPECT_EQ(r.schedule.lr, 3e-4);
  EXPECT_EQ(r.schedule.decay_steps, 1000);
}

TEST(ResumeSchedule, UnchangedOrNoneSaved) {
  EXPECT_EQ(resumed_schedule(kSaved, true, kSaved).line,
            "schedule: cosine from 0.0006 to 6e-05 at step 1000 after 10 warmup steps (as saved)");
  ResumedSchedule old = resumed_schedule(kSaved, true, std::nullopt);
  EXPECT_EQ(old.schedule, kSaved);
  EXPECT_NE(old.line.find("(the checkpoint saved none)"), std::string::npos);
}

}  // namespace
}  // namespace precis::train
