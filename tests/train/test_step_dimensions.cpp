// The step's five dimensions (train/step_dimensions.h) and the kernels matched to
// ops (train/op_kernels.h): on made-up timelines whose split is worked out by
// hand, on a made-up traced GPU step, and on a tiny GPT-2 trained on the CPU,
// whose five times must sum to the measured step and whose compute and memory
// times must be its ops' time.
#include <gtest/gtest.h>

#include <numeric>

#include "support/profiled_run.h"
#include "train/kernel_table.h"
#include "train/op_kernels.h"
#include "train/op_table.h"
#include "train/step_dimensions.h"

using namespace precis;
using namespace precis::train;

namespace {

// 100 GFLOP/s matrix, 10 GFLOP/s vector, 10 GB/s: the matrix ridge at 10 FLOP/B.
Roofline round_roofline() { return Roofline{100e9, 10e9, 10e9, "test"}; }

double sum(const StepDimensions& d) { return std::accumulate(d.ms.begin(), d.ms.end(), 0.0); }

GpuActivity kernel(const std::string& name, double start_ms, double end_ms, int64_t scope) {
  GpuActivity a{GpuActivity::Kind::kernel,          name, static_cast<int64_t>(start_ms * 1e6),
                static_cast<int64_t>(end_ms * 1e6), 7,    0,
                GpuActivity::Stream::compute};
  a.scope = scope;
  return a;
}

GpuActivity copy(const char* name, double start_ms, double end_ms) {
  return {GpuActivity::Kind::memcpy,          name, static_cast<int64_t>(start_ms * 1e6),
          static_cast<int64_t>(end_ms * 1e6), 7,    1 << 20,
          GpuActivity::Stream::compute};
}

// A traced 10 ms step (its trace clock starting at 0): a compute-bound product (intensity
// 100) and a memory-bound embedding gather, each with its kernels; two kernels outside ops
// (a Tensor Core one and an elementwise one); two copies.
ProfiledStep made_up_traced_step() {
  ProfiledStep step;
  step.ms = 10;
  step.traced = true;
  step.start_ns = 0;
  step.end_ns = 10'000'000;
  step.ops = {{"matmul", OpPass::forward, {1e9, 10e6, true}, 3.5}, {"embedding", OpPass::forward, {0, 20e6}, 1.0}};
  step.activities = {
      copy("Memcpy HtoD", 0.5, 1.0),                                         // transfer 0.5; 0.5 idle before it
      kernel("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n", 1.02, 3.0, 0),      // 20 us gap: launch
      kernel("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n", 3.0, 4.0, 0),       // compute 1.98 + 1
      kernel("cublasLt::splitKreduce_kernel", 4.01, 4.5, 0),                 // the op's: compute 0.49
      kernel("precis::cuda::embedding_gather<float>", 5.0, 6.0, 1),          // 0.5 ms gap: idle; memory 1
      copy("Memcpy DtoD", 6.0, 6.5),                                         // memory 0.5
      kernel("nvjet_tst_64x8_64x16_4x1_v_bz_TNN", 6.5, 7.0, -1),             // Tensor Cores outside ops: compute
      kernel("void precis::cuda::scale<float>(float*, int)", 6.8, 7.5, -1),  // overlaps: 7.0-7.5 memory
      copy("Memcpy DtoH", 7.53, 8.0),                                        // 30 us gap: launch; transfer 0.47
  };                                                                         // 2 ms idle at the end
  return step;
}

}  // namespace

TEST(StepDimensions, GapsAreLaunchOverheadUpToTheLimitThenIdle) {
  const double small = kLaunchGapMs / 2, large = kLaunchGapMs * 4;
  std::vector<TimelineItem> items = {{1.0, 2.0, StepDimension::compute},
                                     {2.0 + small, 3.0, StepDimension::memory},
                                     {3.0 + large, 4.0, StepDimension::transfer}};
  StepDimensions d = classify_timeline(items, 5.0);
  EXPECT_NEAR(d.of(StepDimension::compute), 1.0, 1e-12);
  EXPECT_NEAR(d.of(StepDimension::memory), 1.0 - small, 1e-12);
  EXPECT_NEAR(d.of(StepDimension::transfer), 1.0 - large, 1e-12);
  EXPECT_NEAR(d.of(StepDimension::launch), small, 1e-12);
  EXPECT_NEAR(d.of(StepDimension::idle), 1.0 + large + 1.0, 1e-12);  // head, long gap, tail
  EXPECT_NEAR(sum(d), 5.0, 1e-12);
}

TEST(StepDimensions, OverlapGoesToTheActivityThatBeganFirstAndTheStepClips) {
  std::vector<TimelineItem> items = {{0.0, 2.0, StepDimension::memory},
                                     {1.0, 3.0, StepDimension::compute},    // 2.0-3.0 only
                                     {1.5, 1.8, StepDimension::transfer},   // inside the first: nothing
                                     {3.0, 9.0, StepDimension::transfer}};  // clipped to the 4 ms step
  StepDimensions d = classify_timeline(items, 4.0);
  EXPECT_DOUBLE_EQ(d.of(StepDimension::memory), 2.0);
  EXPECT_DOUBLE_EQ(d.of(StepDimension::compute), 1.0);
  EXPECT_DOUBLE_EQ(d.of(StepDimension::transfer), 1.0);
  EXPECT_DOUBLE_EQ(d.of(StepDimension::idle), 0.0);
  EXPECT_DOUBLE_EQ(sum(d), 4.0);
}

TEST(StepDimensions, ATracedStepSplitsItsKernelsByTheirOpsBound) {
  StepDimensions d = step_dimensions({made_up_traced_step()}, round_roofline());
  EXPECT_NEAR(d.of(StepDimension::compute), 1.98 + 1.0 + 0.49 + 0.5, 1e-9);
  EXPECT_NEAR(d.of(StepDimension::memory), 1.0 + 0.5 + 0.5, 1e-9);
  EXPECT_NEAR(d.of(StepDimension::transfer), 0.5 + 0.47, 1e-9);
  EXPECT_NEAR(d.of(StepDimension::launch), 0.02 + 0.01 + 0.03, 1e-9);
  EXPECT_NEAR(d.of(StepDimension::idle), 0.5 + 0.5 + 2.0, 1e-9);
  EXPECT_NEAR(sum(d), 10.0, 1e-9);
  const std::string text = format_step_dimensions(d, true);
  EXPECT_NE(text.find("kernel trace"), std::string::npos) << text;
  EXPECT_NE(text.find("10.000 of a 10.000 ms step"), std::string::npos) << text;
}

TEST(OpKernels, KernelsGroupUnderTheirOpsAndReconcileWithTheKernelTable) {
  const ProfiledStep step = made_up_traced_step();
  std::vector<OpKernels> ops = kernels_by_op({step, step});
  ASSERT_EQ(ops.size(), 3u);
  EXPECT_EQ(ops[0].op, "matmul fwd");
  EXPECT_DOUBLE_EQ(ops[0].event_ms, 3.5);
  EXPECT_NEAR(ops[0].kernel_ms, 1.98 + 1.0 + 0.49, 1e-9);
  ASSERT_EQ(ops[0].kernels.size(), 2u);
  EXPECT_EQ(ops[0].kernels[0].tensor_cores, "bf16");
  EXPECT_DOUBLE_EQ(ops[0].kernels[0].calls, 2);  // per step, over the two steps
  EXPECT_EQ(ops[0].kernels[1].tensor_cores, "no");
  EXPECT_EQ(ops[1].op, "embedding fwd");
  EXPECT_EQ(ops[2].op, "(outside ops)");
  EXPECT_NEAR(ops[2].kernel_ms, 0.5 + 0.7, 1e-9);
  // The kernel table sums the same kernels (per step).
  double table_ms = 0, by_op_ms = 0;
  for (const KernelTotal& k : kernel_totals(step.activities)) table_ms += k.total_ms;
  for (const OpKernels& o : ops) by_op_ms += o.kernel_ms;
  EXPECT_NEAR(by_op_ms, table_ms, 1e-9);
  const std::string text = format_kernels_by_op(ops);
  EXPECT_NE(text.find("in ops"), std::string::npos) << text;
  EXPECT_NE(text.find("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n"), std::string::npos) << text;
}

TEST(OpKernels, UntracedStepsHaveNone) {
  ProfiledStep step;
  step.ms = 1;
  step.ops = {{"matmul", OpPass::forward, {1e6, 1e4, true}, 0.5}};
  EXPECT_TRUE(kernels_by_op({step}).empty());
}

TEST(StepDimensions, TinyGpt2OnTheCpuSumsToTheStep) {
  test::ProfiledRun run = test::profiled_run("step_dimensions",
                                             {"model.n_layer=1", "model.n_head=2", "model.n_embd=32", "max_steps=4",
                                              "log_interval=4", "eval_interval=0", "checkpoint.save_final=false"},
                                             2);
  const OpProfile& profile = *run.profile;
  ASSERT_EQ(profile.steps().size(), 3u);
  const Roofline roofline{1e11, 1e10, 1e10, "test"};
  for (const ProfiledStep& step : profile.steps()) {
    ASSERT_FALSE(step.traced);
    StepDimensions d = classify_timeline(step_timeline(step, roofline), step.ms);
    EXPECT_NEAR(sum(d), step.ms, 1e-9 * step.ms);
    // The ops do not overlap on the CPU: compute and memory are the ops' time, the rest is between them.
    double op_ms = 0;
    for (const OpSample& s : step.ops) op_ms += s.ms;
    EXPECT_NEAR(d.of(StepDimension::compute) + d.of(StepDimension::memory), op_ms, 1e-6 * step.ms);
    EXPECT_GT(d.of(StepDimension::compute), 0);  // the products at 10 FLOP/B and above
    EXPECT_GT(d.of(StepDimension::memory), 0);   // the elementwise ops
    EXPECT_DOUBLE_EQ(d.of(StepDimension::transfer), 0);
    EXPECT_GT(d.of(StepDimension::launch) + d.of(StepDimension::idle), 0);
  }
}
