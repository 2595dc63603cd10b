// What the Trainer's SPMD tests (test_trainer_*_mpi*.cpp) share: on the CPU, per-test
// folders under one root, a small text every rank reads and a tiny GPT-2 config; on
// both, the trained parameters and whether every rank holds the same.
#pragma once

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "distributed/mpi_world.h"
#include "train/config.h"
#include "train/trainer.h"

namespace precis::testing {

class TrainerMpiFiles {
 public:
  // Everything under temp/`root` (one root per test executable: ctest may run them at once).
  explicit TrainerMpiFiles(const std::string& root) : root_(std::filesystem::temp_directory_path() / root) {}

  // A directory for this test (`per_rank`: one per rank), empty.
  std::string fresh_dir(const std::string& name, bool per_rank = false) const {
    const int rank = mpi_world().rank();
    std::filesystem::path dir = root_ / (per_rank ? name + "_rank" + std::to_string(rank) : name);
    if (per_rank || rank == 0) std::filesystem::remove_all(dir);
    mpi_world().barrier();
    return dir.string();
  }

  // A small text of words in a seeded order, written once by rank 0 (every rank reads it).
  std::string text_file() const {
    const std::filesystem::path path = root_ / "words.txt";
    if (mpi_world().rank() == 0) {
      std::filesystem::create_directories(root_);
      const char* words[] = {"the ", "quick ", "brown ", "fox ", "jumps ", "over ", "a ", "lazy ", "dog. ", "\n"};
      std::ofstream out(path);
      uint64_t state = 12345;
      for (int i = 0; i < 4000; ++i) {
        state = state * 6364136223846793005ull + 1442695040888963407ull;
        out << words[(state >> 33) % 10];
      }
    }
    mpi_world().barrier();
    return path.string();
  }

  // A tiny GPT-2 in f32 on the CPU: `rows` rows per rank and micro-step, `accum` micro-steps.
  train::TrainConfig tiny_config(const std::string& out_dir, int64_t rows, int64_t accum, int64_t steps = 4) const {
    return train::parse_config(
        R"(
model: {n_layer: 2, n_head: 2, n_embd: 32, block_size: 16}
data: {tokenizer: char, order: random}
precision: fp32
optimizer: {lr: 1.0e-2, weight_decay: 0.1}
schedule: {kind: cosine, warmup_steps: 1, min_lr: 1.0e-3}
sample: {tokens: 0}
eval_steps: 2
log_interval: 2
device: cpu
threads: 1
distributed: {bucket_mb: 0.005, first_bucket_mb: 0.001}
)",
        {"data.text_file=" + text_file(), "out_dir=" + out_dir, "batch.micro_batch=" + std::to_string(rows),
         "batch.seq_len=16", "batch.grad_accum=" + std::to_string(accum), "max_steps=" + std::to_string(steps),
         "eval_interval=" + std::to_string(steps)});
  }

 private:
  std::filesystem::path root_;
};

inline std::vector<float> parameters_of(train::Trainer& trainer) {
  std::vector<float> all;
  for (const Tensor& p : trainer.model().parameters()) {
    std::vector<float> values = p.to(DType::f32).to_vector<float>();
    all.insert(all.end(), values.begin(), values.end());
  }
  return all;
}

inline double max_abs_difference(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double most = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i)
    most = std::max(most, std::abs(static_cast<double>(a[i]) - static_cast<double>(b[i])));
  return most;
}

// Whether every rank of `group` holds `values` bit for bit as rank 0 does.
inline bool same_on_every_rank(const std::vector<float>& values, distributed::ProcessGroup& group = mpi_world()) {
  Tensor from_rank0 = from_vector<float>(values, {static_cast<int64_t>(values.size())}).to(group.device());
  group.broadcast(from_rank0, 0)->wait();
  return from_rank0.to_vector<float>() == values;
}

}  // namespace precis::testing
