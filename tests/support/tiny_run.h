// A training run small enough for a test that runs several (a 1-layer char GPT on
// tinyshakespeare, on the CPU, a log line every step, no sample, no validation), with its
// out_dir under the temporary folder; and that folder, made empty. Also a tiny ResNet run
// (tiny_resnet_run), the gradient norms a run logged (logged_grad_norms), and a tiny ResNet
// trained on the GPU with what a bit-for-bit comparison of two runs needs (train_tiny_resnet,
// expect_trained_as).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "core/json.h"
#include "train/config.h"
#include "train/trainer.h"

namespace precis::testing {

inline std::filesystem::path empty_temp_dir(const std::string& name) {
  std::filesystem::path dir = std::filesystem::temp_directory_path() / ("precis_test_" + name);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

inline train::TrainConfig tiny_run(const std::filesystem::path& out_dir, std::vector<std::string> overrides) {
  overrides.insert(overrides.begin(), "out_dir=" + out_dir.string());
  return train::parse_config(R"(
model: {n_layer: 1, n_head: 2, n_embd: 16, block_size: 16}
data: {text_file: assets/tinyshakespeare.txt, tokenizer: char}
batch: {micro_batch: 2, seq_len: 16}
sample: {tokens: 0}
eval_interval: 0
log_interval: 1
device: cpu
threads: 2
)",
                             overrides);
}

// ResNet-18 with the CIFAR stem on synthetic 8x8 images of 10 classes, SGD with momentum and
// no clipping, 3 steps of two micro-batches of 16, a log line (a metrics.jsonl row) every step,
// no final checkpoint; `overrides` (device=..., precision=..., max_steps=...) after these.
inline train::TrainConfig tiny_resnet_run(const std::filesystem::path& out_dir, std::vector<std::string> overrides) {
  overrides.insert(overrides.begin(), "out_dir=" + out_dir.string());
  return train::parse_config(R"(
task: image_classification
model: {name: resnet18, cifar_stem: true}
data: {dataset: synthetic, image_size: 8, channels: 3, num_classes: 10}
optimizer: {name: sgd, lr: 0.05, momentum: 0.9, weight_decay: 5.0e-4, grad_clip: 0.0}
schedule: {kind: constant}
batch: {micro_batch: 16, grad_accum: 2}
max_steps: 3
eval_interval: 0
log_interval: 1
checkpoint: {save_final: false}
threads: 2
)",
                             overrides);
}

// The grad_norm of every row of the metrics.jsonl in `out_dir`, in order.
inline std::vector<double> logged_grad_norms(const std::filesystem::path& out_dir) {
  std::vector<double> norms;
  std::ifstream metrics(out_dir / "metrics.jsonl");
  for (std::string line; std::getline(metrics, line);)
    if (!line.empty()) norms.push_back(Json::parse(line).at("grad_norm").as_double());
  return norms;
}

// What a training run leaves for a bit-for-bit comparison with another.
struct TrainedRun {
  std::vector<double> losses, grad_norms;
  std::map<std::string, std::vector<double>> state;  // after training, widened to f64
  std::string out;                                   // the trainer's stdout
};

inline bool identical(const TrainedRun& a, const TrainedRun& b) {
  return a.losses == b.losses && a.grad_norms == b.grad_norms && a.state == b.state;
}

// tiny_resnet_run in the emptied folder `dir`, with `overrides`, trained to the end.
inline TrainedRun train_tiny_resnet(const std::filesystem::path& dir, const std::vector<std::string>& overrides) {
  std::filesystem::remove_all(dir);
  const train::TrainConfig config = tiny_resnet_run(dir, overrides);
  TrainedRun run;
  ::testing::internal::CaptureStdout();
  {
    train::Trainer trainer(config);
    trainer.run();
    run.losses = trainer.losses();
    for (const auto& [name, tensor] : trainer.model().state_dict())
      run.state[name] = tensor.to(Device::cpu()).to(DType::f64).to_vector<double>();
  }
  run.out = ::testing::internal::GetCapturedStdout();
  run.grad_norms = logged_grad_norms(dir);
  return run;
}

// Whether two runs of a reference setting agree bit for bit; says so when they do not (cuDNN
// engines that are not deterministic), since expect_trained_as then compares to 1%.
inline bool runs_agree(const TrainedRun& a, const TrainedRun& b) {
  if (identical(a, b)) return true;
  std::cout << "note: two runs of the reference differ (cuDNN engines that are not deterministic); the losses are "
               "compared to 1%\n";
  return false;
}

// `run` (of another setting that must not change the arithmetic) trained as `reference`: bit for
// bit where the reference's runs agree (runs_agree), else its losses to 1%; and it learned the
// fixed batch. `replayed`: the run said its step was captured into a CUDA graph.
inline void expect_trained_as(const TrainedRun& run, const TrainedRun& reference, bool bit_for_bit, bool replayed) {
  ASSERT_EQ(run.losses.size(), reference.losses.size());
  ASSERT_EQ(run.grad_norms.size(), reference.grad_norms.size());
  if (replayed) {
    EXPECT_NE(run.out.find("cuda graphs: captured"), std::string::npos) << "the step was not replayed:\n" << run.out;
  }
  if (bit_for_bit) {
    EXPECT_EQ(run.losses, reference.losses);
    EXPECT_EQ(run.grad_norms, reference.grad_norms);
    for (const auto& [name, values] : reference.state) EXPECT_EQ(run.state.at(name), values) << name;
  } else {
    for (size_t step = 0; step < reference.losses.size(); ++step)
      EXPECT_NEAR(run.losses[step], reference.losses[step], 1e-2 * std::abs(reference.losses[step]))
          << "step " << step + 1;
  }
  EXPECT_LT(run.losses.back(), run.losses.front()) << "it learns the fixed batch";
}

}  // namespace precis::testing
