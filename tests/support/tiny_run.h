// A training run small enough for a test that runs several (a 1-layer char GPT on
// tinyshakespeare, on the CPU, a log line every step, no sample, no validation), with its
// out_dir under the temporary folder; and that folder, made empty.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "train/config.h"

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

}  // namespace precis::testing
