// Steady-state figures: log intervals after warm-up merged, weighted by their steps.
#include <gtest/gtest.h>

#include "train/steady_state.h"

using namespace precis;

namespace {

train::StepReport interval(int64_t step, double ms, double forward_ms, double optimizer_ms) {
  train::StepReport r;
  r.step = step;
  r.ms = ms;
  r.phase_ms = {{"forward", forward_ms}, {"optimizer", optimizer_ms}};
  return r;
}

}  // namespace

TEST(SteadyState, WeightsIntervalsByStepsAndSkipsWarmup) {
  // Warm-up steps 1-5 (slow), then 5 steps at 10 ms and 2 at 20 ms.
  std::vector<train::StepReport> reports = {interval(5, 500, 400, 50), interval(10, 10, 6, 2), interval(12, 20, 12, 4)};
  train::SteadyState s = train::steady_state(reports, 5);
  EXPECT_EQ(s.steps, 7);
  EXPECT_DOUBLE_EQ(s.ms_per_step, (5 * 10.0 + 2 * 20.0) / 7);
  ASSERT_EQ(s.phase_ms.size(), 2u);
  EXPECT_EQ(s.phase_ms[0].first, "forward");
  EXPECT_DOUBLE_EQ(s.phase_ms[0].second, (5 * 6.0 + 2 * 12.0) / 7);
  EXPECT_DOUBLE_EQ(s.phase_ms[1].second, (5 * 2.0 + 2 * 4.0) / 7);
}

TEST(SteadyState, ThePeakIsTheMeasuredIntervalsOwn) {
  // The warm-up's peak (the algorithm searches' workspaces, say) is not the measured steps'.
  std::vector<train::StepReport> reports = {interval(5, 500, 400, 50), interval(10, 10, 6, 2), interval(12, 20, 12, 4)};
  reports[0].interval_peak_memory_bytes = 900;
  reports[1].interval_peak_memory_bytes = 300;
  reports[2].interval_peak_memory_bytes = 320;
  EXPECT_EQ(train::steady_state(reports, 5).peak_memory_bytes, 320);
  EXPECT_EQ(train::steady_state(reports, 0).peak_memory_bytes, 900);
}

TEST(SteadyState, WithoutWarmupEverythingCountsAndNothingMeasuredIsEmpty) {
  std::vector<train::StepReport> reports = {interval(3, 30, 1, 1)};
  EXPECT_EQ(train::steady_state(reports, 0).steps, 3);
  EXPECT_DOUBLE_EQ(train::steady_state(reports, 0).ms_per_step, 30);
  train::SteadyState none = train::steady_state(reports, 1);  // the only interval starts in warm-up
  EXPECT_EQ(none.steps, 0);
  EXPECT_TRUE(none.phase_ms.empty());
}
