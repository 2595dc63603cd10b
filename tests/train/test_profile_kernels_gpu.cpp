// The op profile's kernel side on a GPU (needs CUPTI): every kernel of a profiled
// step tied to the op that launched it, an op's kernels summing to about its event
// time, Tensor Core rows for a bf16 matmul, and a tiny GPT-2 step's five dimensions
// summing to the measured step with its kernels reconciled between the per-op
// and the per-kernel tables.
#include <gtest/gtest.h>

#include <chrono>
#include <numeric>

#include "core/autograd.h"
#include "core/gpu.h"
#include "core/kernel_trace.h"
#include "core/op_profile.h"
#include "core/pinned.h"
#include "core/random.h"
#include "ops/matmul.h"
#include "support/gpu.h"
#include "support/profiled_run.h"
#include "train/kernel_table.h"
#include "train/op_kernels.h"
#include "train/op_table.h"
#include "train/step_dimensions.h"
#include "train/tensor_cores.h"

using namespace precis;

#define PRECIS_SKIP_WITHOUT_CUPTI()                                                                          \
  do {                                                                                                       \
    PRECIS_SKIP_WITHOUT_GPU();                                                                               \
    if (!kernel_trace_available()) GTEST_SKIP() << "no kernel trace: " << kernel_trace_unavailable_reason(); \
  } while (0)

TEST(ProfileKernelsGpu, ABf16MatmulsKernelsAreItsOwnAndRunOnTensorCores) {
  PRECIS_SKIP_WITHOUT_CUPTI();
  const Device gpu = Device::cuda(0);
  NoGradGuard no_grad;
  Generator gen(0);
  Tensor a = randn({4096, 4096}, DType::bf16, &gen).to(gpu);
  for (int i = 0; i < 3; ++i) ops::matmul(a, a);  // the algorithm chosen, the workspace allocated
  synchronize(gpu);
  const auto start = std::chrono::steady_clock::now();  // one product's time, untraced
  for (int i = 0; i < 5; ++i) ops::matmul(a, a);
  synchronize(gpu);
  const double host_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count() / 5;
  OpProfile profile(gpu, /*trace_kernels=*/true);
  profile.begin_step();
  for (int i = 0; i < 5; ++i) ops::matmul(a, a);
  profile.end_step();
  const ProfiledStep& step = profile.steps()[0];
  ASSERT_TRUE(step.traced);
  ASSERT_EQ(step.ops.size(), 5u);
  std::vector<double> kernel_ms(step.ops.size(), 0.0);
  bool tensor_cores = false;
  for (const GpuActivity& a : step.activities) {
    if (a.kind != GpuActivity::Kind::kernel) continue;
    ASSERT_GE(a.scope, 0) << a.name << " was launched outside the matmuls";
    ASSERT_LT(a.scope, 5);
    kernel_ms[static_cast<size_t>(a.scope)] += static_cast<double>(a.end_ns - a.start_ns) / 1e6;
    const train::TensorCoreUse use = train::tensor_core_use(train::short_kernel_name(a.name));
    if (use.tensor_cores) {
      tensor_cores = true;
      EXPECT_TRUE(use.input_type == "bf16" || use.input_type == "?") << a.name << ": " << use.input_type;
    }
  }
  EXPECT_TRUE(tensor_cores) << "no kernel of a bf16 matmul ran on Tensor Cores";
  for (size_t i = 0; i < step.ops.size(); ++i) {
    EXPECT_LE(kernel_ms[i], step.ops[i].ms * 1.02) << "op " << i;
    // (an op's event time under the trace also holds the GPU's waits for the slowed launches)
    EXPECT_GE(kernel_ms[i], host_ms * 0.8) << "op " << i << ": a product of 4096 is its kernels";
  }
  std::vector<train::KernelTotal> totals = train::kernel_totals(step.activities);
  std::cout << train::kernel_table(totals, step.ms);
  ASSERT_FALSE(totals.empty());
  EXPECT_NE(totals[0].tensor_cores, "no") << totals[0].name;
}

TEST(ProfileKernelsGpu, TinyGpt2StepsFiveDimensionsSumToTheStep) {
  PRECIS_SKIP_WITHOUT_CUPTI();
  test::ProfiledRun run =
      test::profiled_run("profile_kernels_gpu",
                         {"device=cuda", "precision=bf16", "max_steps=5", "log_interval=5", "eval_interval=0",
                          "checkpoint.save_final=false", "batch.micro_batch=32", "batch.seq_len=64"},
                         3);
  const OpProfile& profile = *run.profile;
  ASSERT_EQ(profile.steps().size(), 3u);
  const train::Roofline roofline = train::device_roofline(Device::cuda(0), DType::bf16, false);
  for (const ProfiledStep& step : profile.steps()) {
    ASSERT_TRUE(step.traced);
    const train::StepDimensions d = train::classify_timeline(train::step_timeline(step, roofline), step.ms);
    EXPECT_NEAR(std::accumulate(d.ms.begin(), d.ms.end(), 0.0), step.ms, 1e-9 * step.ms);
    EXPECT_GT(d.of(train::StepDimension::compute), 0);
    EXPECT_GT(d.of(train::StepDimension::memory), 0);
    // The trace's span of the step and the host's agree: the trace clock's step is the host's.
    EXPECT_NEAR(static_cast<double>(step.end_ns - step.start_ns) / 1e6, step.ms, 0.05 * step.ms + 0.1);
  }
  std::cout << train::format_step_dimensions(train::step_dimensions(profile.steps(), roofline), true);
  // The kernels by op add up to the kernel table's total, and most kernel time is in ops.
  const std::vector<train::OpKernels> by_op = train::kernels_by_op(profile.steps());
  std::cout << train::format_kernels_by_op(by_op);
  double by_op_ms = 0, outside_ms = 0, table_ms = 0;
  for (const train::OpKernels& o : by_op) (o.op == "(outside ops)" ? outside_ms : by_op_ms) += o.kernel_ms;
  for (const ProfiledStep& step : profile.steps()) {
    std::vector<GpuActivity> work;
    for (const GpuActivity& a : step.activities)
      if (a.role != GpuActivity::Stream::communication) work.push_back(a);
    for (const train::KernelTotal& k : train::kernel_totals(work)) table_ms += k.total_ms;
  }
  table_ms /= static_cast<double>(profile.steps().size());
  EXPECT_NEAR(by_op_ms + outside_ms, table_ms, 1e-6 * table_ms);
  EXPECT_GT(by_op_ms, outside_ms);
  // Each op's kernels fit in its event time (the events bracket them on the stream).
  for (const train::OpKernels& o : by_op) {
    if (o.op != "(outside ops)") {
      EXPECT_LE(o.kernel_ms, o.event_ms * 1.02 + 1e-3) << o.op;
    }
  }
}
