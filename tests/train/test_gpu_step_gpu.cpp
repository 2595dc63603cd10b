// The GPU training step and its CUDA graph, end to end on a tiny char-level GPT-2:
// the device-parameterised step cases (train/step_cases.h) on the GPU, the GPU step
// against the CPU's losses and grad norms (fp32, relative 1e-4), and graph replay
// against the eager GPU step (relative 1e-6; the kernels are deterministic, so in
// practice bit for bit) under a changing learning rate, gradient accumulation,
// clipping, evaluation between replays, fp16 with a dynamic loss scale that
// overflows inside the graph, numerics report steps between replays, and a
// checkpoint resumed into a new graph.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "support/gpu.h"
#include "train/config.h"
#include "train/step_cases.h"
#include "train/trainer.h"

using namespace precis;
namespace fs = std::filesystem;

namespace step_cases {
INSTANTIATE_TEST_SUITE_P(Cuda, StepOn, ::testing::Values(Device::cuda(0)), precis::testing::device_name);
}  // namespace step_cases

namespace {

// lr warms up over 5 steps, then decays: it changes every step. Clipping at 0.5 is active.
const char* kTiny = R"(
model: {n_layer: 2, n_head: 2, n_embd: 32, block_size: 32, dropout: 0.0}
data: {text_file: assets/tinyshakespeare.txt, tokenizer: char}
optimizer: {lr: 3.0e-3, beta2: 0.99, weight_decay: 0.1, grad_clip: 0.5}
schedule: {kind: cosine, warmup_steps: 5, min_lr: 1.0e-4}
batch: {micro_batch: 4, seq_len: 32, grad_accum: 2}
sample: {tokens: 0}
checkpoint: {save_final: false}
eval_interval: 0
eval_steps: 2
log_interval: 1
threads: 2
)";

struct TrainedRun {
  std::vector<double> losses;
  std::vector<train::StepReport> reports;
  std::string out, err;
  bool replaying = false;
};

TrainedRun run_training(const std::string& name, std::vector<std::string> overrides, bool fresh = true) {
  fs::path dir = fs::temp_directory_path() / ("precis_gpu_step_" + name);
  if (fresh) fs::remove_all(dir);
  overrides.push_back("out_dir=" + dir.string());
  train::Trainer trainer(train::parse_config(kTiny, overrides));
  ::testing::internal::CaptureStdout();
  ::testing::internal::CaptureStderr();
  trainer.run();
  TrainedRun r;
  r.out = ::testing::internal::GetCapturedStdout();
  r.err = ::testing::internal::GetCapturedStderr();
  r.losses = trainer.losses();
  r.reports = trainer.reports();
  r.replaying = trainer.replaying_graph();
  return r;
}

void expect_relative(double got, double want, double rtol, const std::string& what) {
  EXPECT_NEAR(got, want, rtol * std::abs(want)) << what;
}

// Same losses, grad norms, learning rates, loss scales and skipped steps, step by step.
void expect_same_run(const TrainedRun& got, const TrainedRun& want, double rtol) {
  ASSERT_EQ(got.losses.size(), want.losses.size());
  for (size_t i = 0; i < want.losses.size(); ++i) {
    ASSERT_TRUE(std::isfinite(got.losses[i])) << "step " << i + 1;
    expect_relative(got.losses[i], want.losses[i], rtol, "loss at step " + std::to_string(i + 1));
  }
  ASSERT_EQ(got.reports.size(), want.reports.size());
  for (size_t i = 0; i < want.reports.size(); ++i) {
    const train::StepReport &g = got.reports[i], &w = want.reports[i];
    const std::string at = " at step " + std::to_string(w.step);
    EXPECT_EQ(g.step, w.step);
    EXPECT_EQ(g.lr, w.lr) << "lr" << at;
    if (std::isinf(w.grad_norm)) {
      EXPECT_TRUE(std::isinf(g.grad_norm)) << "grad norm" << at;
    } else {
      expect_relative(g.grad_norm, w.grad_norm, rtol, "grad norm" + at);
    }
    EXPECT_EQ(g.loss_scale, w.loss_scale) << "loss scale" << at;
    EXPECT_EQ(g.skipped_steps, w.skipped_steps) << "skipped steps" << at;
    ASSERT_EQ(g.val_loss.has_value(), w.val_loss.has_value()) << at;
    if (w.val_loss) expect_relative(*g.val_loss, *w.val_loss, rtol, "val loss" + at);
  }
}

void expect_captured(const TrainedRun& run) {
  EXPECT_TRUE(run.replaying) << run.err;
  EXPECT_NE(run.out.find("cuda graphs: captured the training step"), std::string::npos) << run.out << run.err;
  EXPECT_EQ(run.err.find("cuda_graphs: not used"), std::string::npos) << run.err;
}

}  // namespace

TEST(CudaGraphs, ReplayedStepsKeepTheirPhases) {
  PRECIS_SKIP_WITHOUT_GPU();
  TrainedRun run = run_training("phases", {"device=cuda", "max_steps=8", "precision.policy=bf16", "cuda_graphs=true"});
  expect_captured(run);
  EXPECT_NE(run.out.find("its phases timed by event nodes in the graph"), std::string::npos) << run.out;
  // Step 4 is captured; steps 5 to 8 are replays, each report one step (log_interval 1).
  ASSERT_EQ(run.reports.size(), 8u);
  for (size_t i = 4; i < run.reports.size(); ++i) {
    const train::StepReport& r = run.reports[i];
    std::map<std::string, double> phase(r.phase_ms.begin(), r.phase_ms.end());
    const std::string at = " at step " + std::to_string(r.step);
    EXPECT_FALSE(phase.count("graph")) << at;
    for (const char* name : {"forward", "backward", "optimizer"}) EXPECT_GT(phase[name], 0) << name << at;
    double sum = 0;
    for (const auto& [name, ms] : r.phase_ms) sum += ms;
    EXPECT_LE(sum, r.ms * 1.05) << "the phases exceed the step" << at;
  }
}

TEST(GpuStep, Fp32LossesAndGradNormsMatchTheCpu) {
  PRECIS_SKIP_WITHOUT_GPU();
  const std::vector<std::string> common = {"max_steps=20", "precision.policy=fp32"};
  auto with = [&](const char* device) {
    std::vector<std::string> o = common;
    o.push_back(std::string("device=") + device);
    return o;
  };
  TrainedRun cpu = run_training("cpu", with("cpu")), gpu = run_training("gpu", with("cuda"));
  expect_same_run(gpu, cpu, 1e-4);
  EXPECT_LT(gpu.losses.back(), gpu.losses.front() - 0.3) << "the model learns";
}

TEST(CudaGraphs, ReplayGivesTheEagerLossesInFp32) {
  PRECIS_SKIP_WITHOUT_GPU();
  const std::vector<std::string> common = {"device=cuda", "max_steps=12", "precision.policy=fp32", "eval_interval=5"};
  std::vector<std::string> graphs = common;
  graphs.push_back("cuda_graphs=true");
  TrainedRun eager = run_training("fp32_eager", common), graph = run_training("fp32_graph", graphs);
  expect_captured(graph);
  EXPECT_FALSE(eager.replaying);
  expect_same_run(graph, eager, 1e-6);
}

TEST(CudaGraphs, Fp16OverflowsSkipInsideTheGraphAsInEagerSteps) {
  PRECIS_SKIP_WITHOUT_GPU();
  // A scale of 2^24 that doubles after every clean step keeps running into fp16's range:
  // it backs off from the first steps on, and then overflows every other step or so.
  const std::vector<std::string> common = {"device=cuda", "max_steps=24", "precision.policy=fp16",
                                           "precision.loss_scale=16777216", "precision.growth_interval=1"};
  std::vector<std::string> graphs = common;
  graphs.push_back("cuda_graphs=true");
  TrainedRun eager = run_training("fp16_eager", common), graph = run_training("fp16_graph", graphs);
  expect_captured(graph);
  expect_same_run(graph, eager, 1e-6);
  // Skips happened in replayed steps (the graph is captured at step 4), and clean steps too.
  int64_t skips_in_graph = 0;
  for (size_t i = 1; i < graph.reports.size(); ++i)
    if (graph.reports[i].step >= 4)
      skips_in_graph += graph.reports[i].skipped_steps - graph.reports[i - 1].skipped_steps;
  EXPECT_GT(skips_in_graph, 0);
  EXPECT_LT(graph.reports.back().skipped_steps, 20) << "most steps should not be skipped";
}

TEST(CudaGraphs, NumericsReportStepsRunEagerlyBetweenReplays) {
  PRECIS_SKIP_WITHOUT_GPU();
  const std::vector<std::string> common = {"device=cuda", "max_steps=12", "precision.policy=fp16",
                                           "precision.report=true", "precision.report_interval=5"};
  std::vector<std::string> graphs = common;
  graphs.push_back("cuda_graphs=true");
  TrainedRun eager = run_training("report_eager", common), graph = run_training("report_graph", graphs);
  EXPECT_NE(graph.err.find("numerics report steps run eagerly"), std::string::npos) << graph.err;
  expect_captured(graph);
  expect_same_run(graph, eager, 1e-6);
  EXPECT_NE(graph.out.find("numerics at step 11"), std::string::npos) << "a report after the capture";
}

TEST(CudaGraphs, AResumedRunReproducesTheStraightOne) {
  PRECIS_SKIP_WITHOUT_GPU();
  const std::vector<std::string> common = {"device=cuda", "precision.policy=fp16", "cuda_graphs=true",
                                           "checkpoint.interval=5", "schedule.decay_steps=10"};
  auto with = [&](const std::string& steps, bool resume) {
    std::vector<std::string> o = common;
    o.push_back("max_steps=" + steps);
    if (resume) o.push_back("checkpoint.resume=true");
    return o;
  };
  TrainedRun straight = run_training("straight", with("10", false));
  run_training("resumed", with("5", false));  // checkpoints at step 5, after two replays
  TrainedRun resumed = run_training("resumed", with("10", true), /*fresh=*/false);
  expect_captured(straight);
  expect_captured(resumed);
  ASSERT_EQ(resumed.losses.size(), 5u);
  for (size_t i = 0; i < 5; ++i)
    expect_relative(resumed.losses[i], straight.losses[5 + i], 1e-6, "loss at step " + std::to_string(6 + i));
}

TEST(CudaGraphs, DropoutFallsBackToEagerWithTheReason) {
  PRECIS_SKIP_WITHOUT_GPU();
  TrainedRun run = run_training("dropout", {"device=cuda", "max_steps=5", "cuda_graphs=true", "model.dropout=0.1"});
  EXPECT_FALSE(run.replaying);
  EXPECT_NE(run.err.find("cuda_graphs: not used: dropout draws its random offset on the host"), std::string::npos)
      << run.err;
  EXPECT_EQ(run.losses.size(), 5u);
}
