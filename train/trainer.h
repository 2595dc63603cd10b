// Trainer: the training loop of `precis train CONFIG` (docs/architecture.md, "How a step flows").
//
// Builds the task (train/task.h: the data and the model; GPT-2 language modelling or
// image classification), packs the model's parameters into flat buffers on the
// device, and makes the optimizer and the schedule from a TrainConfig; then per step:
// grad_accum micro-batches of forward + backward (loss scaled by 1/grad_accum),
// gradient clipping, the learning rate for this step, the optimizer update.
// Every log_interval it prints one line with the phase breakdown and writes
// the same record to out_dir/metrics.jsonl; every eval_interval it measures the
// validation loss (and accuracy); it checkpoints, and the task finishes (GPT-2 prints a text sample).
//
// The step is the same calls on both devices, and on a GPU it never waits for
// the host: the loss is summed into a tensor, the loss scaler's state, the
// learning rate and the step count are tensors on the parameters' device, the
// step ends with finish_step (unscale -> clip -> optimizer step -> scaler
// update, nothing read back), and the values a log line shows (loss, grad norm,
// scale, skipped steps) are read back once per log interval. With
// `cuda_graphs: true` the whole step is captured into a CUDA graph after a few
// eager warm-up steps and replayed from then on (train/step_graph.h).
//
// Data parallelism (docs/distributed.md): under a launch of several ranks (mpirun,
// srun, torchrun-style variables) each rank takes its own device (cuda:LOCAL_RANK,
// or the CPU) and its own rows of every global batch; rank 0's parameters are
// broadcast after the model is built; a Reducer (distributed/reducer.h) averages
// the gradients during the backward of the last micro-step (the ones before run
// under no_sync), and finish_step sees the averaged gradients, so every rank takes
// the same optimizer step. The losses and the validation loss are averaged over the
// ranks; rank 0 alone prints, writes metrics, numerics, checkpoints and the sample.
// One rank runs the same code with no process group and no reducer.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "amp/grad_scaler.h"
#include "amp/numerics.h"
#include "amp/precision_policy.h"
#include "core/json.h"
#include "core/op_profile.h"
#include "core/profiler.h"
#include "distributed/process_group.h"
#include "distributed/reducer.h"
#include "distributed/zero.h"
#include "models/gpt2.h"
#include "nn/flat_parameters.h"
#include "optim/lr_schedule.h"
#include "optim/optimizer.h"
#include "train/config.h"
#include "train/step_graph.h"
#include "train/step_report.h"
#include "train/task.h"

namespace precis::train {

class StepTrace;
class RunLock;

class Trainer {
 public:
  // The process group comes from the launch (distributed::detect_launch): none for one process.
  explicit Trainer(TrainConfig config);
  // The given process group (null or of one rank: one process, whatever the launch says).
  Trainer(TrainConfig config, std::shared_ptr<distributed::ProcessGroup> group);
  ~Trainer();

  // Trains to max_steps (from the latest checkpoint when checkpoint.resume is set).
  void run();
  // Steps from `first_step` on (1-based, as in the log line) are recorded into `profile`
  // (core/op_profile.h: every op timed with its cost); the caller keeps it alive through run().
  // Not with cuda_graphs: a replayed graph has no ops to time.
  void profile_ops(OpProfile* profile, int64_t first_step);
  // Mean validation loss over the task's validation batches (the same batches each time);
  // a classification's accuracy on them is then last_val_accuracy().
  double evaluate();
  std::optional<double> last_val_accuracy() const { return last_val_accuracy_; }
  // GPT-2: generates from the prompt and returns the decoded text.
  std::string sample(const std::string& prompt, int64_t tokens);

  // The per-step training losses of this run (for tests and the sweep), complete after run().
  const std::vector<double>& losses() const { return losses_; }
  // Whether the training step is being replayed from a CUDA graph.
  bool replaying_graph() const { return step_graph_ && step_graph_->replaying(); }
  const std::vector<StepReport>& reports() const { return reports_; }
  int64_t step() const { return step_; }
  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  nn::Module& model() { return task_->model(); }
  Task& task() { return *task_; }
  // The GPT-2 of a language-model run (an error for another task).
  models::GPT2& gpt2();
  // This rank's optimizer (under ZeRO-1: over its shard of the parameters).
  const optim::Optimizer& optimizer() const { return *optimizer_; }
  // The data-parallel gradient reducer; null in one process.
  const distributed::Reducer* reducer() const { return reducer_.get(); }
  const TrainConfig& config() const { return config_; }
  const amp::PrecisionPolicy& policy() const { return policy_; }
  const amp::GradScaler& scaler() const { return *scaler_; }
  // Final validation loss of run() (NaN without validation data).
  double final_val_loss() const { return final_val_loss_; }
  // Most bytes the device allocator held in tensors at once during run(), plus the buffers in
  // the process group's registered memory (ZeRO-1 on NCCL).
  int64_t peak_memory_bytes() const;
  // Bytes of the flat parameter buffers in the process group's registered memory (ZeRO-1 on
  // NCCL), outside the device allocator; 0 otherwise.
  int64_t registered_memory_bytes() const { return registered_bytes_; }
  // distributed.fused_gather: whether the optimizer stores into every rank's parameters (ZeRO-1,
  // distributed/zero.h), and if it was tried (true, or auto) and cannot be, why.
  bool gather_fused() const { return zero_ && zero_->gather_fused(); }
  const std::string& fused_gather_unavailable() const { return fused_gather_why_; }

 private:
  // The device of this rank and its process group (`detect`: from the launch, else `group`).
  void setup_distributed(bool detect, std::shared_ptr<distributed::ProcessGroup> group);
  // Every rank must run the same batch shape, steps and seed: an error on every rank otherwise.
  void check_same_config_on_every_rank();
  // Each value averaged over the ranks (itself on one rank).
  std::vector<double> mean_over_ranks(std::vector<double> values);
  bool is_main() const { return rank_ == 0; }
  // ZeRO-1 gathers the parameters behind the next step's forward (distributed.gather_overlap).
  bool gather_overlap() const { return zero_ && config_.distributed.gather_overlap; }
  void setup();
  void setup_task();
  void setup_model();
  void setup_weight_casts();  // optimizer.writes_weight_casts (weight_casts_ below)
  void setup_step();          // the step's device tensors (loss sum, grad norm)
  void train_step();          // one optimizer step; its loss goes to losses_, resolved at the next log
  // The step on batches already where they are computed (accum of each): forward, backward
  // (the loss summed into loss_sum_), finish_step. Phases are timed unless `profiler` is null
  // (while capturing).
  void run_step(const std::vector<Tensor>& inputs, const std::vector<Tensor>& targets, Profiler* profiler);
  // unscale -> clip -> optimizer step -> scaler update, with nothing read back.
  void finish_step(Profiler* profiler);
  // The step's batches, on the device (on a GPU in the fixed buffers device_inputs_/device_targets_).
  void stage_batches(std::vector<Tensor>& inputs, std::vector<Tensor>& targets);
  // Why the step cannot be captured into a CUDA graph, or empty.
  std::string graph_fallback_reason() const;
  void queue_loss();
  // Waits for the queued steps once and fills in their losses and the last grad norm.
  void resolve_step_values();
  void save_checkpoint();
  // The signal to stop on (train/interrupt.h), or 0; with several ranks agreed on at log steps.
  int pending_interrupt(bool log_step);
  // Writes a checkpoint (unless this step already did), then throws StoppedRun naming it.
  [[noreturn]] void stop_on_signal(int signal, bool checkpoint_written);
  // Stops the run under on_nonfinite: stop after too many skipped steps in a row (a read-back).
  void check_nonfinite();
  bool report_due() const;
  void print_zero_line() const;
  void start_numerics();
  void finish_numerics(const std::vector<Tensor>& params_before);
  bool try_resume();
  Json train_state() const;
  void log_interval(double loss, double grad_norm, double lr, double interval_seconds, int64_t steps_in_interval,
                    std::optional<double> val_loss);

  TrainConfig config_;
  std::unique_ptr<RunLock> run_lock_;  // rank 0's hold on out_dir from setup to the end of run()
  Device device_;
  std::shared_ptr<distributed::ProcessGroup> group_;  // null for one process
  std::unique_ptr<distributed::Reducer> reducer_;     // with group_
  std::unique_ptr<distributed::Zero1> zero_;          // with group_ and distributed.zero 1
  std::string fused_gather_why_;                      // distributed.fused_gather tried, not possible: why
  int rank_ = 0, world_size_ = 1;
  std::unique_ptr<Task> task_;
  std::shared_ptr<nn::FlatParameters> flat_;
  int64_t registered_bytes_ = 0;      // of flat_'s buffers in the group's registered memory (ZeRO-1 on NCCL)
  int64_t peak_before_interval_ = 0;  // the most memory any earlier log interval held (with registered_bytes_)
  std::unique_ptr<optim::Optimizer> optimizer_;
  // optimizer.writes_weight_casts: each floating flat buffer's cast to the compute dtype, which
  // the optimizer writes as it updates the weights (none when off, without autocast, or under
  // ZeRO-1, whose optimizer updates one shard); current once a step has written them, until
  // something else writes the weights (a resume).
  std::vector<Tensor> weight_casts_;
  bool weight_casts_current_ = false;
  amp::PrecisionPolicy policy_;
  std::unique_ptr<amp::GradScaler> scaler_;
  amp::NumericsReport numerics_;
  JsonlWriter numerics_out_;
  bool reporting_ = false;  // the numerics report is recording this step
  double final_val_loss_ = 0;
  std::optional<double> last_val_accuracy_;
  optim::LrSchedule schedule_;
  Profiler profiler_;
  std::unique_ptr<StepTrace> step_trace_;  // profile.trace
  OpProfile* op_profile_ = nullptr;        // profile_ops
  int64_t op_profile_from_ = 0;
  JsonlWriter metrics_;
  int64_t step_ = 0;
  int64_t steps_run_ = 0;  // by this process (a resumed run starts at 0 again)
  double last_grad_norm_ = 0;
  std::vector<double> losses_;
  // The step's values on device_: the loss summed over the micro-batches (f64 scalar) and
  // {grad norm, gradient factor} (f64 [2]); the losses queued for the host (pinned f64
  // scalars, with their index in losses_); on a GPU the fixed buffers the batches are copied into.
  Tensor loss_sum_, grad_norm_;
  std::vector<std::pair<size_t, Tensor>> pending_losses_;
  std::vector<Tensor> device_inputs_, device_targets_;
  std::vector<Tensor> staged_inputs_;      // the host batches last copied into them (the same one is not copied again)
  std::unique_ptr<StepGraph> step_graph_;  // made by run()
  std::vector<StepReport> reports_;
};

}  // namespace precis::train
