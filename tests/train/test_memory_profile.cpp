// Memory over a profiled step (train/memory_profile.h): the owners of the peak on a
// made-up step whose figures are known, and on a tiny GPT-2 trained on the CPU, where
// the parameters are the model's count x 4 bytes, the five owners sum to the
// allocator's peak, and no sample exceeds it.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "nn/flat_parameters.h"
#include "nn/linear.h"
#include "optim/adamw.h"
#include "support/profiled_run.h"
#include "train/memory_profile.h"
#include "train/trainer.h"

using namespace precis;
using namespace precis::train;

// The gradients' bytes follow precision.grad_dtype: 2 a bf16 parameter with bf16 gradients, 4 with f32 ones.
TEST(MemoryProfile, GradientBytesFollowThePolicysGradientDtype) {
  nn::Linear layer(24, 8);
  nn::flatten_parameters(layer, Device::cpu(), DType::bf16, 1, DType::bf16);
  optim::AdamW adamw({{layer.parameters(), 0.0}}, {.lr = 1e-3});
  const int64_t n = 24 * 8 + 8;
  EXPECT_EQ(memory_owners(layer, adamw, DType::bf16).gradients, 2 * n);
  EXPECT_EQ(memory_owners(layer, adamw, DType::f32).gradients, 4 * n);
  EXPECT_EQ(memory_owners(layer, adamw, DType::bf16).parameters, 2 * n);
}

TEST(MemoryProfile, OwnersOfTheMadeUpPeak) {
  StepMemory memory;
  memory.start.allocated_bytes = 1000;  // 100 parameters, 100 gradients, 200 state: 600 else live
  memory.peak = 1500;
  memory.samples = {{0.0, 1000, 1200, "step <"}, {1.0, 1400, 1600, "matmul fwd >"}, {2.0, 1100, 1600, "step >"}};
  MemoryBreakdown b = memory_breakdown(memory, {100, 100, 200});
  EXPECT_EQ(b.workspace, 600);
  EXPECT_EQ(b.activations, 500);
  EXPECT_EQ(b.parameters + b.gradients + b.optimizer_state + b.workspace + b.activations, b.peak);
  EXPECT_EQ(b.peak_at, "matmul fwd >");
  EXPECT_EQ(b.sampled_peak, 1400);
  EXPECT_EQ(b.reserved_at_peak, 1600);
  EXPECT_EQ(b.most_reserved, 1600);
}

// ZeRO-1 on NCCL keeps the parameter buffer in NCCL-registered memory, outside the allocator:
// the same step with those 100 bytes outside it, so 100 fewer allocated at its start and peak.
TEST(MemoryProfile, RegisteredParametersAreOutsideThePeak) {
  StepMemory memory;
  memory.start.allocated_bytes = 900;
  memory.peak = 1400;
  memory.samples = {{0.0, 900, 1100, "step <"}, {1.0, 1300, 1500, "matmul fwd >"}, {2.0, 1000, 1500, "step >"}};
  MemoryBreakdown b =
      memory_breakdown(memory, {.parameters = 100, .gradients = 100, .optimizer_state = 200, .registered = 100});
  EXPECT_EQ(b.parameters, 0);
  EXPECT_EQ(b.registered, 100);
  EXPECT_EQ(b.workspace, 600);    // as in OwnersOfTheMadeUpPeak: not 500
  EXPECT_EQ(b.activations, 500);  // and not 600
  EXPECT_EQ(b.parameters + b.gradients + b.optimizer_state + b.workspace + b.activations, b.peak);
}

TEST(MemoryProfile, TinyGpt2OnTheCpu) {
  test::ProfiledRun run = test::profiled_run("memory_profile",
                                             {"model.n_layer=1", "model.n_head=2", "model.n_embd=32", "max_steps=3",
                                              "log_interval=3", "eval_interval=0", "checkpoint.save_final=false"},
                                             2);
  Trainer& trainer = *run.trainer;
  const OpProfile& profile = *run.profile;
  ASSERT_EQ(profile.steps().size(), 2u);
  const MemoryOwners owners = memory_owners(trainer.model(), trainer.optimizer(), trainer.policy().grad_dtype);
  EXPECT_EQ(owners.parameters, trainer.model().num_parameters() * 4);  // f32
  EXPECT_EQ(owners.gradients, owners.parameters);
  EXPECT_EQ(owners.optimizer_state, 2 * owners.parameters);  // AdamW's two moments
  const StepMemory& memory = profile.steps().back().memory;
  // A sample at the step's two ends and at each op's two.
  EXPECT_EQ(memory.samples.size(), 2 + 2 * profile.steps().back().ops.size());
  for (size_t i = 1; i < memory.samples.size(); ++i) EXPECT_GE(memory.samples[i].ms, memory.samples[i - 1].ms);
  const MemoryBreakdown b = memory_breakdown(memory, owners);
  EXPECT_EQ(b.parameters + b.gradients + b.optimizer_state + b.workspace + b.activations, b.peak);
  EXPECT_GT(b.activations, 0) << "the forward's saved activations";
  EXPECT_LE(b.sampled_peak, b.peak);
  EXPECT_GE(static_cast<int64_t>(memory.start.allocated_bytes),
            owners.parameters + owners.gradients + owners.optimizer_state);

  const std::string svg = (std::filesystem::path(trainer.config().out_dir) / "memory.svg").string();
  std::ostringstream out;
  print_memory_profile(out, profile.steps(), owners, svg);
  EXPECT_NE(out.str().find("activations, temporaries"), std::string::npos) << out.str();
  EXPECT_NE(out.str().find("fragmentation"), std::string::npos) << out.str();
  std::ifstream in(svg);
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_NE(text.str().find("allocated"), std::string::npos);
  EXPECT_NE(text.str().find("reserved"), std::string::npos);
}
