// The language-model task (`task: language_model`, the default): GPT-2 on token windows
// (train/task.h). Its data is a text file tokenised into out_dir/data or llm.c token
// shards (data/token_dataset.h); its loss the mean next-token cross-entropy, with the
// fused classifier when `fused_classifier` is on; its checkpoints Hugging Face's GPT-2
// layout (train/checkpoint.h); at the end it prints a sample.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "data/token_dataset.h"
#include "data/tokenizer.h"
#include "distributed/process_group.h"
#include "models/gpt2.h"
#include "train/config.h"
#include "train/task.h"

namespace precis::train {

class LmTask : public Task {
 public:
  // Sets config.model.vocab_size from the data's tokenizer. `group` (null for one process):
  // rank 0 tokenises a text file while the others wait.
  LmTask(TrainConfig& config, int rank, int world_size, distributed::ProcessGroup* group);

  nn::Module& model() override { return *model_; }
  models::GPT2& gpt2() { return *model_; }
  TaskBatch next_batch() override;
  TaskLoss forward(const Tensor& inputs, const Tensor& targets, const Tensor& loss_gradient) override;
  bool fuses_loss_gradient() const override { return config_.fused_classifier; }
  bool has_validation() const override { return val_data_ != nullptr; }
  EvalTotals evaluate() override;
  CheckpointModel checkpoint_model() override { return gpt2_checkpoint_model(*model_); }
  Json state() const override;
  void restore(const Json& state) override;
  std::string describe() const override;
  std::string data_description() const override;
  int64_t items_per_batch() const override { return config_.batch.micro_batch * config_.batch.seq_len; }
  const char* item_unit() const override { return "tok"; }
  double train_flops_per_item() const override;
  std::string graph_fallback_reason() const override;
  void finish() override;

  // Generates from the prompt and returns the decoded text.
  std::string sample(const std::string& prompt, int64_t tokens);

 private:
  void setup_data(int rank, int world_size, distributed::ProcessGroup* group);

  const TrainConfig& config_;
  std::unique_ptr<Tokenizer> tokenizer_;
  Json tokenizer_json_;  // how to rebuild the tokenizer (saved with checkpoints)
  std::vector<std::string> train_files_, val_files_;
  std::unique_ptr<TokenDataset> train_data_, val_data_;
  TokenDatasetPosition val_start_;
  std::unique_ptr<models::GPT2> model_;
};

}  // namespace precis::train
