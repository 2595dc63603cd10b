// Trainer: the training loop of `precis train CONFIG` (DESIGN.md section 7).
//
// Builds the data, the GPT-2 model (parameters packed into flat buffers on the
// device), the optimizer and the schedule from a TrainConfig; then per step:
// grad_accum micro-batches of forward + backward (loss scaled by 1/grad_accum),
// gradient clipping, the learning rate for this step, the optimizer update.
// Every log_interval it prints one line with the phase breakdown and writes
// the same record to out_dir/metrics.jsonl; every eval_interval it measures the
// validation loss; it checkpoints, and it prints a text sample at the end.
//
// On a GPU the step never waits for the host (train/gpu_step.cpp): the loss is
// summed on the device, the loss scaler, the learning rate and the step count
// live there, and the values a log line shows are read back once per log
// interval. With `cuda_graphs: true` the whole step is captured into a CUDA
// graph after a few eager warm-up steps and replayed from then on.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "amp/grad_scaler.h"
#include "amp/numerics.h"
#include "amp/precision_policy.h"
#include "core/cuda_graph.h"
#include "core/json.h"
#include "core/profiler.h"
#include "data/token_dataset.h"
#include "data/tokenizer.h"
#include "models/gpt2.h"
#include "nn/flat_parameters.h"
#include "optim/lr_schedule.h"
#include "optim/optimizer.h"
#include "train/config.h"
#include "train/step_report.h"

namespace precis::train {

class StepTrace;

class Trainer {
 public:
  explicit Trainer(TrainConfig config);
  ~Trainer();

  // Trains to max_steps (from the latest checkpoint when checkpoint.resume is set).
  void run();
  // Mean validation loss over eval_steps batches (the same batches each time).
  double evaluate();
  // Generates from the prompt and returns the decoded text.
  std::string sample(const std::string& prompt, int64_t tokens);

  // The per-step training losses of this run (for tests and the sweep), complete after run().
  const std::vector<double>& losses() const { return losses_; }
  // Whether the training step is being replayed from a CUDA graph.
  bool replaying_graph() const { return graph_ != nullptr; }
  const std::vector<StepReport>& reports() const { return reports_; }
  int64_t step() const { return step_; }
  models::GPT2& model() { return *model_; }
  const TrainConfig& config() const { return config_; }
  const amp::PrecisionPolicy& policy() const { return policy_; }
  const amp::GradScaler& scaler() const { return *scaler_; }
  // Final validation loss of run() (NaN without validation data).
  double final_val_loss() const { return final_val_loss_; }
  // Most bytes the device allocator held in tensors at once during run().
  int64_t peak_memory_bytes() const;

 private:
  void setup_data();
  void setup_model();
  void train_step();  // one optimizer step; its loss goes to losses_ (on a GPU: resolved at the next log)
  // The step on batches already where they are computed (accum of each): forward, backward,
  // the scaler, clipping, the optimizer. Phases are timed unless `profiler` is null (while
  // capturing). Returns the mean loss on the CPU; on a GPU the loss is summed into loss_sum_.
  double run_step(const std::vector<Tensor>& inputs, const std::vector<Tensor>& targets, Profiler* profiler);
  void finish_step_on_host(Profiler* profiler);
  void finish_step_on_device(Profiler* profiler);
  // The step's batches, on the device (in gpu_inputs_/gpu_targets_ for the GPU step).
  void stage_batches(std::vector<Tensor>& inputs, std::vector<Tensor>& targets);
  // train/gpu_step.cpp: the sync-free GPU step and its CUDA graph.
  void setup_gpu_step();
  std::string graph_fallback_reason() const;
  void plan_graphs();  // decides use_graphs_, saying why not when cuda_graphs cannot be used
  void gpu_train_step(const std::vector<Tensor>& inputs, const std::vector<Tensor>& targets);
  void capture_and_replay(const std::vector<Tensor>& inputs, const std::vector<Tensor>& targets);
  void queue_loss();
  // Waits for the queued steps once and fills in their losses and the last grad norm.
  void resolve_step_values();
  void save_checkpoint();
  bool report_due() const;
  void start_numerics();
  void finish_numerics(const std::vector<Tensor>& params_before);
  bool try_resume();
  Json train_state() const;
  void log_interval(double loss, double grad_norm, double lr, double interval_seconds, int64_t steps_in_interval,
                    std::optional<double> val_loss);

  TrainConfig config_;
  Device device_;
  std::unique_ptr<Tokenizer> tokenizer_;
  Json tokenizer_json_;  // how to rebuild the tokenizer (saved with checkpoints)
  std::vector<std::string> train_files_, val_files_;
  std::unique_ptr<TokenDataset> train_data_, val_data_;
  TokenDatasetPosition val_start_;
  std::unique_ptr<models::GPT2> model_;
  std::shared_ptr<nn::FlatParameters> flat_;
  std::unique_ptr<optim::Optimizer> optimizer_;
  amp::PrecisionPolicy policy_;
  std::unique_ptr<amp::GradScaler> scaler_;
  amp::NumericsReport numerics_;
  JsonlWriter numerics_out_;
  bool reporting_ = false;  // the numerics report is recording this step
  double final_val_loss_ = 0;
  optim::LrSchedule schedule_;
  Profiler profiler_;
  std::unique_ptr<StepTrace> step_trace_;  // profile.trace
  JsonlWriter metrics_;
  int64_t step_ = 0;
  double last_grad_norm_ = 0;
  std::vector<double> losses_;
  // The sync-free GPU step: the loss summed over the micro-batches (f64 scalar), {grad norm,
  // clip factor} (f64 [2]), the device buffers the batches are copied into, and the losses
  // queued for the host (pinned f64 scalars, with their index in losses_).
  bool gpu_step_ = false;
  Tensor loss_sum_, grad_norm_;
  std::vector<Tensor> gpu_inputs_, gpu_targets_;
  std::vector<std::pair<size_t, Tensor>> pending_losses_;
  // cuda_graphs: the step is captured after a few eager GPU steps (warm-up), unless it cannot be.
  bool use_graphs_ = false;
  int64_t eager_gpu_steps_ = 0;
  std::unique_ptr<CudaGraph> graph_;
  std::vector<StepReport> reports_;
};

}  // namespace precis::train
