// The learning-rate schedules against their closed forms (optim/lr_schedule.h), written out
// here independently: lr = 1, min_lr = 0.1, 10 warmup steps, decay to step 110.
#include <gtest/gtest.h>

#include <cmath>

#include "core/error.h"
#include "optim/lr_schedule.h"

namespace precis {
namespace {

optim::LrSchedule schedule(const std::string& kind) { return optim::LrSchedule{kind, 1.0, 0.1, 10, 110, 0.2}; }

TEST(LrScheduleKinds, EveryKindWarmsUpLinearly) {
  for (const std::string& kind : optim::LrSchedule::kinds()) {
    EXPECT_DOUBLE_EQ(schedule(kind).at(0), 1.0 / 11) << kind;
    EXPECT_DOUBLE_EQ(schedule(kind).at(4), 5.0 / 11) << kind;
    EXPECT_DOUBLE_EQ(schedule(kind).at(10), 1.0) << kind;  // the peak right after warmup
  }
}

TEST(LrScheduleKinds, ConstantAfterWarmup) {
  EXPECT_DOUBLE_EQ(schedule("constant").at(9), 10.0 / 11);
  EXPECT_DOUBLE_EQ(schedule("constant").at(5000), 1.0);
}

TEST(LrScheduleKinds, LinearDecayToMinLr) {
  optim::LrSchedule s = schedule("linear");
  EXPECT_DOUBLE_EQ(s.at(35), 1.0 - 0.25 * 0.9);  // a quarter of the way from 10 to 110
  EXPECT_DOUBLE_EQ(s.at(60), 0.55);
  EXPECT_DOUBLE_EQ(s.at(109), 1.0 - 0.99 * 0.9);
  EXPECT_DOUBLE_EQ(s.at(110), 0.1);
  EXPECT_DOUBLE_EQ(s.at(1000), 0.1);
}

TEST(LrScheduleKinds, WarmupStableDecay) {
  // 100 steps after warmup, the last 20 of them (90..110) decaying linearly.
  optim::LrSchedule s = schedule("wsd");
  EXPECT_DOUBLE_EQ(s.at(11), 1.0);
  EXPECT_DOUBLE_EQ(s.at(89), 1.0);
  EXPECT_DOUBLE_EQ(s.at(90), 1.0);
  EXPECT_DOUBLE_EQ(s.at(95), 1.0 - 0.25 * 0.9);
  EXPECT_DOUBLE_EQ(s.at(100), 0.55);
  EXPECT_DOUBLE_EQ(s.at(110), 0.1);
  EXPECT_DOUBLE_EQ(s.at(111), 0.1);
  s.decay_fraction = 1.0;  // the whole run decays: the linear schedule
  for (int64_t step : {10, 37, 60, 109, 110}) EXPECT_DOUBLE_EQ(s.at(step), schedule("linear").at(step)) << step;
}

TEST(LrScheduleKinds, InverseSquareRoot) {
  optim::LrSchedule s = schedule("inverse_sqrt");
  EXPECT_DOUBLE_EQ(s.at(43), 0.5);  // sqrt(11 / 44)
  EXPECT_DOUBLE_EQ(s.at(98), std::sqrt(11.0 / 99.0));
  EXPECT_DOUBLE_EQ(s.at(1099), 0.1);  // no floor at min_lr: sqrt(11 / 1100) = 0.1 by chance
  EXPECT_LT(s.at(10000), 0.1);
}

TEST(LrScheduleKinds, CosineIsUnchanged) {
  optim::LrSchedule s = schedule("cosine");
  EXPECT_DOUBLE_EQ(s.at(35), 0.1 + 0.5 * (1 + std::cos(M_PI * 0.25)) * 0.9);
  EXPECT_DOUBLE_EQ(s.at(110), 0.1);
}

TEST(LrScheduleKinds, JsonRoundTripAndDescription) {
  optim::LrSchedule s{"wsd", 6e-4, 6e-5, 100, 5000, 0.1};
  EXPECT_EQ(optim::LrSchedule::from_json(Json::parse(s.to_json().dump())), s);
  EXPECT_EQ(s.describe(), "wsd from 0.0006 to 6e-05 at step 5000 (the last 0.1 of it decaying) after 100 warmup steps");
}

}  // namespace
}  // namespace precis
