// profile.trace_steps: a trace of two consecutive replayed steps holds both steps' GPU work
// (twice the kernels of a one-step trace of the same graph) under one "steps A-B" event, and
// the trainer says which steps it traced.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "core/json.h"
#include "core/kernel_trace.h"
#include "support/gpu.h"
#include "support/tiny_run.h"

using namespace precis;
namespace fs = std::filesystem;

namespace {

struct Traced {
  std::string out;        // the trainer's stdout
  std::string step_name;  // the trace's step event
  int64_t kernels = 0;    // kernel events in the trace
};

Traced trace(const std::string& name, int64_t first, int64_t steps) {
  const fs::path dir = precis::testing::empty_temp_dir("trace_steps_" + name);
  const fs::path path = dir / "trace.json";
  train::Trainer trainer(precis::testing::tiny_run(
      dir, {"device=cuda", "cuda_graphs=true", "max_steps=6", "profile.trace=" + path.string(),
            "profile.trace_step=" + std::to_string(first), "profile.trace_steps=" + std::to_string(steps)}));
  Traced t;
  ::testing::internal::CaptureStdout();
  trainer.run();
  t.out = ::testing::internal::GetCapturedStdout();
  const Json trace = read_json_file(path.string());  // held: a range-for over a temporary's member dangles
  for (const Json& e : trace.at("traceEvents").as_array()) {
    if (e.at("ph").as_string() != "X") continue;
    if (e.at("cat").as_string() == "step") t.step_name = e.at("name").as_string();
    if (e.at("cat").as_string() == "kernel") ++t.kernels;
  }
  return t;
}

}  // namespace

TEST(TraceStepsGpu, TwoReplayedStepsHoldTwiceTheKernelsOfOne) {
  PRECIS_SKIP_WITHOUT_GPU();
  if (!kernel_trace_available()) GTEST_SKIP() << kernel_trace_unavailable_reason();
  const Traced one = trace("one", 5, 1), two = trace("two", 5, 2);
  EXPECT_NE(one.out.find("trace of step 5: "), std::string::npos) << one.out;
  EXPECT_NE(two.out.find("trace of steps 5-6: "), std::string::npos) << two.out;
  EXPECT_NE(two.out.find("cuda graphs: captured"), std::string::npos) << "the steps were not replayed:\n" << two.out;
  EXPECT_EQ(one.step_name, "step 5");
  EXPECT_EQ(two.step_name, "steps 5-6");
  ASSERT_GT(one.kernels, 0);
  EXPECT_EQ(two.kernels, 2 * one.kernels);
}
