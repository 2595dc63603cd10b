// The op profile on a GPU: each op's CUDA-event time agrees with the same op
// timed alone by the host around device syncs, the op times fit inside the step,
// a tiny GPT-2 step's ops add up to most of it, and the roofline of a known GPU is
// its datasheet's.
#include <gtest/gtest.h>

#include <chrono>

#include "core/autograd.h"
#include "core/gpu.h"
#include "core/op_profile.h"
#include "core/pinned.h"
#include "core/random.h"
#include "ops/matmul.h"
#include "support/demo_config.h"
#include "support/gpu.h"
#include "train/op_table.h"
#include "train/trainer.h"

using namespace precis;

TEST(OpProfileGpu, AnOpsEventTimeMatchesItsHostTimeAlone) {
  PRECIS_SKIP_WITHOUT_GPU();
  const Device gpu = Device::cuda(0);
  NoGradGuard no_grad;
  Generator gen(0);
  Tensor a = randn({4096, 4096}, DType::bf16, &gen).to(gpu);
  for (int i = 0; i < 3; ++i) ops::matmul(a, a);  // warm-up: the algorithm chosen, the workspace allocated
  synchronize(gpu);
  auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < 5; ++i) ops::matmul(a, a);
  synchronize(gpu);
  const double host_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count() / 5;

  OpProfile profile(gpu);  // untraced: events only, as a training step's profile
  profile.begin_step();
  for (int i = 0; i < 5; ++i) ops::matmul(a, a);
  profile.end_step();
  const ProfiledStep& step = profile.steps()[0];
  ASSERT_EQ(step.ops.size(), 5u);
  double sum = 0;
  for (const OpSample& s : step.ops) {
    EXPECT_EQ(s.op, "matmul");
    EXPECT_DOUBLE_EQ(s.cost.flops, 2.0 * 4096 * 4096 * 4096);
    EXPECT_GT(s.ms, 0.5 * host_ms);
    EXPECT_LT(s.ms, 1.5 * host_ms);
    sum += s.ms;
  }
  EXPECT_LE(sum, step.ms);
}

TEST(OpProfileGpu, TinyGpt2StepIsMostlyOps) {
  PRECIS_SKIP_WITHOUT_GPU();
  train::TrainConfig config = test::demo_config(
      "op_profile_gpu", {"device=cuda", "precision=bf16", "max_steps=5", "log_interval=5", "eval_interval=0",
                         "checkpoint.save_final=false", "batch.micro_batch=32", "batch.seq_len=64"});
  train::Trainer trainer(config);
  OpProfile profile(Device::cuda(0));
  trainer.profile_ops(&profile, 3);
  trainer.run();
  train::OpTable table = train::op_table(profile.steps());
  const train::Roofline roofline = train::device_roofline(Device::cuda(0), DType::bf16, false);
  std::cout << train::format_op_table(table, roofline) << train::format_amdahl_table(table, roofline);
  EXPECT_LE(table.op_ms, table.step_ms);
  // A tiny model on a GPU is launch-bound: the ops' share is reported, and must be real.
  EXPECT_GT(table.op_ms, 0.2 * table.step_ms);
  bool any_matrix = false;
  for (const train::OpRow& r : table.rows) any_matrix = any_matrix || (r.cost.matrix && r.cost.flops > 0);
  EXPECT_TRUE(any_matrix);
  if (peak_tflops(0, DType::bf16, false) > 0) {
    EXPECT_DOUBLE_EQ(roofline.matrix_flops, peak_tflops(0, DType::bf16, false) * 1e12);
    EXPECT_DOUBLE_EQ(roofline.bytes_per_s, peak_memory_gbps(0) * 1e9);
  }
}
