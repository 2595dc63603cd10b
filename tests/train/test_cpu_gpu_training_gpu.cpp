// The same tiny GPT-2 trained 50 steps on the CPU and on the GPU, from the same seed on the
// same batches of the shipped tinyshakespeare: every step's loss agrees to 1e-4 (relative)
// in fp32, and within 2% in bf16 and in bf16-pure with bf16 gradients (precision.grad_dtype:
// the GPU's products, layer norms and embedding write them rounding once, the CPU's are
// rounded as the ops return them). The GPU run goes through every fused path of a training
// step (residual add + layer norm, the MLP's GELU epilogues, the padded classifier's loss,
// flash attention in bf16, fused AdamW), the CPU run through the plain compositions.
// Skipped, with the reason, where no GPU is usable.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "support/gpu.h"
#include "support/loss_curves.h"
#include "train/config.h"
#include "train/trainer.h"

using namespace precis;
using precis::testing::largest_relative_difference;
namespace fs = std::filesystem;

namespace {

// A 2-layer model on 65 characters (padded to 128 classes), head dim 64, no dropout.
// `grad_dtype`: precision.grad_dtype (the policy's where empty).
std::vector<double> train_losses(const std::string& device, const std::string& precision,
                                 const std::string& grad_dtype = "") {
  const fs::path dir = fs::temp_directory_path() / ("precis_cpu_gpu_" + device + "_" + precision + grad_dtype);
  fs::remove_all(dir);
  train::TrainConfig config =
      train::parse_config(R"(
model: {n_layer: 2, n_head: 2, n_embd: 128, block_size: 64, dropout: 0.0}
data: {text_file: assets/tinyshakespeare.txt, tokenizer: char}
optimizer: {lr: 2.0e-3, beta2: 0.99, weight_decay: 0.1, grad_clip: 1.0}
schedule: {kind: cosine, warmup_steps: 10, min_lr: 2.0e-4}
batch: {micro_batch: 8, seq_len: 64, grad_accum: 2}
sample: {tokens: 0}
max_steps: 50
eval_interval: 0
log_interval: 10
threads: 2
)",
                          {"device=" + device, "precision=" + precision, "out_dir=" + dir.string()});
  if (!grad_dtype.empty()) config.precision.policy.grad_dtype = parse_dtype(grad_dtype);
  train::Trainer trainer(config);
  trainer.run();
  return trainer.losses();
}

}  // namespace

TEST(CpuGpuTraining, Fp32LossesAgreeForFiftySteps) {
  PRECIS_SKIP_WITHOUT_GPU();
  const std::vector<double> cpu = train_losses("cpu", "fp32"), gpu = train_losses("cuda", "fp32");
  EXPECT_LE(largest_relative_difference(cpu, gpu, 50u), 1e-4);
  EXPECT_LT(cpu.back(), cpu.front() - 0.5) << "the model learns: from ln(65) = 4.17";
}

TEST(CpuGpuTraining, Bf16LossesAgreeForFiftySteps) {
  PRECIS_SKIP_WITHOUT_GPU();
  const std::vector<double> cpu = train_losses("cpu", "bf16"), gpu = train_losses("cuda", "bf16");
  EXPECT_LE(largest_relative_difference(cpu, gpu, 50u), 0.02);
}

TEST(CpuGpuTraining, Bf16PureWithBf16GradientsLossesAgreeForFiftySteps) {
  PRECIS_SKIP_WITHOUT_GPU();
  const std::vector<double> cpu = train_losses("cpu", "bf16-pure", "bfloat16"),
                            gpu = train_losses("cuda", "bf16-pure", "bfloat16");
  EXPECT_LE(largest_relative_difference(cpu, gpu, 50u), 0.02);
  EXPECT_LT(gpu.back(), gpu.front() - 0.5) << "the model learns with bf16 gradients";
}
