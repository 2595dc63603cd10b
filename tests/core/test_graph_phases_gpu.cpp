// Profiler phases inside a CUDA graph (core/profiler.h, core/cuda_graph.h): the
// phases' events become event record nodes of the captured graph, swapped for
// fresh events at each replay, so a replayed step is timed phase by phase. The
// reference is the same work run eagerly with ordinary phase events, and a pair
// of events around each whole replay.
#include <gtest/gtest.h>

#include <map>

#include "core/copy.h"
#include "core/cuda_graph.h"
#include "core/profiler.h"
#include "core/tensor.h"
#include "support/gpu.h"

using namespace precis;

namespace {

std::map<std::string, double> phases(Profiler& p) {
  std::map<std::string, double> out;
  for (const auto& [name, ms] : p.take_ms()) out[name] += ms;
  return out;
}

}  // namespace

TEST(GraphPhases, ReplayedPhasesAreTimedLikeEagerOnesAndSumToTheReplay) {
  PRECIS_SKIP_WITHOUT_GPU();
  const Device gpu = Device::cuda(0);
  const int64_t n = int64_t{64} << 20;  // 256 MiB of f32 per tensor: each copy dwarfs a launch
  Tensor a = zeros({n}, DType::f32, gpu), b = ones({n}, DType::f32, gpu), c = zeros({n}, DType::f32, gpu);
  // Two phases, the second three times the first's copies.
  auto work = [&](Profiler& p) {
    p.begin("one");
    copy_(a, b);
    p.end();
    p.begin("three");
    copy_(c, b);
    copy_(a, c);
    copy_(c, a);
    p.end();
  };
  constexpr int kReps = 5;
  Profiler eager;
  eager.set_device(gpu);
  for (int i = 0; i < 2; ++i) work(eager);
  phases(eager);  // the warm-up's
  for (int i = 0; i < kReps; ++i) work(eager);
  const std::map<std::string, double> eager_ms = phases(eager);

  Profiler timed, whole;
  timed.set_device(gpu);
  whole.set_device(gpu);
  CudaGraph graph(gpu);
  graph.capture([&] {
    timed.begin_graph_capture();
    work(timed);
    timed.end_graph_capture();
  });
  timed.keep_graph_phases([&](void* event) { return graph.has_event_node(event); });
  ASSERT_TRUE(timed.graph_has_phases());
  for (int i = 0; i < kReps; ++i) {
    whole.begin("replay");
    graph.replay(timed.graph_replay_events());
    whole.end();
  }
  const std::map<std::string, double> graph_ms = phases(timed);
  const double replay_ms = phases(whole).at("replay");

  ASSERT_EQ(graph_ms.size(), 2u);
  const double one = graph_ms.at("one"), three = graph_ms.at("three");
  EXPECT_GT(one, 0);
  EXPECT_NEAR(three / one, 3.0, 0.6) << "one " << one << " ms, three " << three << " ms";
  EXPECT_NEAR(one, eager_ms.at("one"), 0.15 * eager_ms.at("one"));
  EXPECT_NEAR(three, eager_ms.at("three"), 0.15 * eager_ms.at("three"));
  // The phases cover the graph's work back to back: their sum is the replays' time.
  EXPECT_LE(one + three, replay_ms * 1.01);
  EXPECT_GE(one + three, replay_ms * 0.95) << "replays " << replay_ms << " ms";
}
