// `precis bench gpt2 --trace` on a GPU: the trace file parses, holds the CPU
// phases and every kernel of the step (a cuBLAS gemm and our layer norm among
// them) inside the step's time window, the kernels add up to a plausible part
// of the step, and the top-kernels table is printed.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <filesystem>

#include "core/json.h"
#include "core/kernel_trace.h"
#include "support/cli.h"
#include "support/gpu.h"

namespace fs = std::filesystem;
using precis::Json;

namespace {

std::string lower(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(), [](unsigned char c) { return std::tolower(c); });
  return text;
}

}  // namespace

TEST(BenchGpu, TracedStepHoldsEveryKernelInsideTheStep) {
  PRECIS_SKIP_WITHOUT_GPU();
  if (!precis::kernel_trace_available()) GTEST_SKIP() << precis::kernel_trace_unavailable_reason();
  fs::path dir = fs::temp_directory_path() / "precis_bench_gpu_trace";
  fs::remove_all(dir);
  fs::create_directories(dir);
  fs::path trace_path = dir / "step.json";
  auto r = precis::testing::run_cli(
      "bench gpt2 --preset tiny --batch 8 --seq 128 --precision bf16 --steps 2 "
      "--warmup 2 --device cuda --trace " +
      trace_path.string() + " --out " + (dir / "out").string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("trace of step 3: " + trace_path.string()), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("% step"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("measured     2 steps after 2 warm-up step(s) and the traced step"), std::string::npos)
      << r.output;

  Json trace = precis::read_json_file(trace_path.string());
  double step_us = -1;
  double kernel_us = 0;
  bool gemm = false, layer_norm = false, memcpy = false;
  std::vector<std::string> phases;
  std::vector<const Json*> gpu_events;
  for (const Json& e : trace.at("traceEvents").as_array()) {
    if (e.at("ph").as_string() != "X") continue;
    const std::string& cat = e.at("cat").as_string();
    const std::string name = e.at("name").as_string();
    if (cat == "step") step_us = e.at("dur").as_double();
    if (cat == "phase") phases.push_back(name);
    if (cat == "kernel" || cat == "memcpy" || cat == "memset") gpu_events.push_back(&e);
    if (cat == "kernel") {
      kernel_us += e.at("dur").as_double();
      // cuBLASLt's kernels: "...gemm..." or "...xmma..." (CUTLASS-style), "nvjet_..." (Hopper's own).
      const std::string l = lower(name);
      gemm = gemm || l.find("gemm") != std::string::npos || l.find("xmma") != std::string::npos ||
             l.find("nvjet") != std::string::npos;
      layer_norm = layer_norm || name.find("layer_norm") != std::string::npos;
    }
    memcpy = memcpy || cat == "memcpy";
  }
  ASSERT_GT(step_us, 0) << "no step event";
  EXPECT_TRUE(gemm) << "no cuBLASLt product kernel in the trace";
  EXPECT_TRUE(layer_norm) << "no layer norm kernel in the trace";
  EXPECT_TRUE(memcpy) << "no memcpy (the batch's host-to-device copy) in the trace";
  for (const char* phase : {"data", "forward", "backward", "optimizer"})
    EXPECT_NE(std::find(phases.begin(), phases.end(), phase), phases.end()) << phase;

  // The GPU was idle when the step began and waited for at its end, so every
  // GPU event lies inside the step (50 us allowed for the clock alignment).
  for (const Json* e : gpu_events) {
    double start = e->at("ts").as_double(), end = start + e->at("dur").as_double();
    EXPECT_GE(start, -50.0) << e->at("name").as_string();
    EXPECT_LE(end, step_us + 50.0) << e->at("name").as_string();
  }
  // One compute stream runs kernels one after another: together they fill
  // some of the step and never more than all of it.
  EXPECT_GT(kernel_us, 0.01 * step_us);
  EXPECT_LE(kernel_us, 1.01 * step_us);
}
