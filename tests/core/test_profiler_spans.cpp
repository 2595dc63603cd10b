// The profiler's span recording (the CPU track of a trace): only while on,
// one span per ended phase with its name, in the order the phases end.
#include <gtest/gtest.h>

#include <thread>

#include "core/profiler.h"

using namespace precis;

TEST(ProfilerSpans, RecordedOnlyWhileOn) {
  Profiler profiler;
  { Profiler::Phase phase(profiler, "data"); }
  profiler.record_spans(true);
  auto before = Profiler::Clock::now();
  {
    Profiler::Phase outer(profiler, "forward");
    Profiler::Phase inner(profiler, "attention");
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  { Profiler::Phase phase(profiler, "backward"); }
  auto after = Profiler::Clock::now();
  profiler.record_spans(false);
  { Profiler::Phase phase(profiler, "optimizer"); }

  std::vector<Profiler::Span> spans = profiler.take_spans();
  ASSERT_EQ(spans.size(), 3u);
  EXPECT_EQ(spans[0].name, "attention");  // inner phases end first
  EXPECT_EQ(spans[1].name, "forward");
  EXPECT_EQ(spans[2].name, "backward");
  EXPECT_LE(spans[1].start, spans[0].start);  // forward contains attention
  EXPECT_GE(spans[1].end, spans[0].end);
  EXPECT_GE(spans[0].end - spans[0].start, std::chrono::milliseconds(2));
  for (const auto& s : spans) {
    EXPECT_GE(s.start, before);
    EXPECT_LE(s.end, after);
  }
  EXPECT_TRUE(profiler.take_spans().empty());
  // The totals are unaffected by span recording.
  EXPECT_EQ(profiler.take_ms().size(), 5u);
}
