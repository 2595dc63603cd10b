// Non-finite training on a GPU (issue 16): the found_inf flag, the skip and the count run on
// the device, eagerly and inside a replayed CUDA graph, for a policy without loss scaling
// (bf16) as for fp32; the diverged run stops with the non-finite exit code after the same
// number of steps as on the CPU, with finite weights and checkpoints.
#include <gtest/gtest.h>

#include "support/gpu.h"
#include "support/tiny_run.h"
#include "train/exit_codes.h"
#include "train/nonfinite.h"
#include "train/trainer.h"

using namespace precis;
using namespace precis::train;

namespace {

struct Stopped {
  int exit_code = 0;
  int64_t step = 0, skipped = 0;
  bool weights_finite = true;
};

Stopped diverge(const std::string& name, const std::string& device, const std::string& precision, bool graphs) {
  Trainer trainer(precis::testing::tiny_run(
      precis::testing::empty_temp_dir("nonfinite_gpu_" + name),
      {"device=" + device, "precision=" + precision, std::string("cuda_graphs=") + (graphs ? "true" : "false"),
       "optimizer.lr=1e6", "schedule.kind=constant", "optimizer.grad_clip=0", "max_steps=60", "log_interval=7",
       "max_nonfinite_steps=4", "checkpoint.interval=5"}));
  Stopped out;
  try {
    trainer.run();
  } catch (const StoppedRun& e) {
    out.exit_code = e.exit_code();
  }
  out.step = trainer.step();
  out.skipped = trainer.scaler().skipped_steps();
  for (const Tensor& p : trainer.model().parameters()) out.weights_finite &= first_nonfinite(p) == -1;
  return out;
}

}  // namespace

TEST(NonfiniteGpu, DivergedRunsStopLikeOnTheCpuEagerAndInAGraph) {
  PRECIS_SKIP_WITHOUT_GPU();
  const Stopped cpu = diverge("cpu", "cpu", "fp32", false);
  ASSERT_EQ(cpu.exit_code, kExitNonFinite);
  for (const char* precision : {"fp32", "bf16"})
    for (bool graphs : {false, true}) {
      const Stopped gpu = diverge(std::string(precision) + (graphs ? "_graph" : "_eager"), "cuda", precision, graphs);
      EXPECT_EQ(gpu.exit_code, kExitNonFinite) << precision << (graphs ? " graph" : " eager");
      EXPECT_LT(gpu.step, 60) << precision;
      EXPECT_GE(gpu.skipped, 4) << precision;
      EXPECT_TRUE(gpu.weights_finite) << precision << ": skipped steps leave the weights as they were";
    }
}
