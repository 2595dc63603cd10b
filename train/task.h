// Task: what a kind of training run adds to the Trainer's loop (train/trainer.h).
//
// The loop itself (micro-batches, the precision policy's autocast and loss scaling,
// finish_step, the DDP reducer, CUDA graphs, the step breakdown, logging, evaluation
// cadence, checkpoints and resume) is the same for every task. A task owns its data
// and its model and says how a micro-batch becomes a loss, how to evaluate, what its
// checkpoint holds and what its log line counts. Two tasks exist: the GPT-2 language
// model (train/lm_task.h, `task: language_model`) and image classification
// (train/image_task.h, `task: image_classification`).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "core/json.h"
#include "core/tensor.h"
#include "nn/module.h"
#include "train/checkpoint.h"

namespace precis::train {

// One micro-batch of this rank, on the host (pinned when the task prepared it so).
struct TaskBatch {
  Tensor inputs, targets;
};

struct TaskLoss {
  Tensor loss;  // scalar: the micro-batch's mean loss
  // Set when the forward already made the gradient of loss_gradient * loss (GPT-2's fused
  // classifier): the backward is autograd::backward(backward_output, backward_grad).
  Tensor backward_output, backward_grad;
};

// A validation pass, summed over this rank's batches.
struct EvalTotals {
  double loss_sum = 0;  // the mean loss is loss_sum / loss_count
  double loss_count = 0;
  double correct = 0;  // classification: right predictions among `examples`, else 0
  double examples = 0;
};

class Task {
 public:
  virtual ~Task() = default;

  virtual nn::Module& model() = 0;
  // The next training micro-batch of this rank.
  virtual TaskBatch next_batch() = 0;
  // The forward of one micro-batch already on the model's device, inside the policy's
  // autocast scope. `loss_gradient` (a device scalar: loss scale / micro-batches) is given
  // when fuses_loss_gradient() and autograd is recording.
  virtual TaskLoss forward(const Tensor& inputs, const Tensor& targets, const Tensor& loss_gradient) = 0;
  virtual bool fuses_loss_gradient() const { return false; }
  // Classification: the accuracy of the last training micro-batch (read back now); else nullopt.
  virtual std::optional<double> last_train_accuracy() { return std::nullopt; }

  virtual bool has_validation() const = 0;
  // The validation batches (the same ones every time), in eval mode without autograd.
  virtual EvalTotals evaluate() = 0;

  // What the checkpoint saves of the model, and the task's part of the trainer's JSON state
  // (the data position, random streams, model config) and how to continue from it.
  virtual CheckpointModel checkpoint_model() = 0;
  virtual Json state() const = 0;
  virtual void restore(const Json& state) = 0;

  // The run's header: the model ("GPT-2 4 layers, ...") and the data and batch.
  virtual std::string describe() const = 0;
  virtual std::string data_description() const = 0;
  // Examples of one micro-batch of one rank (tokens or images), and their unit in the log ("tok", "img").
  virtual int64_t items_per_batch() const = 0;
  virtual const char* item_unit() const = 0;
  // Training FLOPs per item (forward and backward); 0 when not counted (no TFLOP/s, no MFU).
  virtual double train_flops_per_item() const { return 0; }
  // Why a CUDA graph cannot capture this task's step, or empty.
  virtual std::string graph_fallback_reason() const { return ""; }
  // After the last step (GPT-2: the sample), on rank 0.
  virtual void finish() {}
};

}  // namespace precis::train
