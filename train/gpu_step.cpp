// The training step on a GPU with no host synchronisation, and its CUDA graph
// (members of Trainer, train/trainer.h).
//
// Nothing in the step reads a value back, so the host queues step after step
// and the GPU does not idle between them:
//   - the batches cross into fixed device buffers through pinned staging;
//   - each micro-batch's loss is added to a device f64 scalar (as the host loop
//     adds them), copied to pinned memory after the step and read when a log
//     line needs it: loss = sum / grad_accum, the host's formula;
//   - the loss scaler's scale, counters and inf/NaN flag live on the device
//     (GradScaler::keep_on_device); a step with inf/NaN is skipped by the
//     optimizer kernel, which reads the flag, and the scale backs off or grows
//     in a one-thread kernel;
//   - the grad norm and clip factor are computed on the device
//     (clip_grad_norm_on_device), which also unscales: the norm of the scaled
//     gradients is finite exactly when every gradient is (the inf/NaN check), and
//     AdamW applies clip / scale as it reads each gradient;
//   - AdamW reads the learning rate and the step count from device memory;
//     set_lr queues each step's rate from pinned memory ahead of the step.
// Scale, skipped steps and grad norm are read back once per log interval.
// (What still synchronises in an eager step: the embedding and cross-entropy
// index checks, which read one flag back per call outside a capture.)
//
// CUDA graphs (cuda_graphs: true). Every per-step value now comes from device
// memory, so a step is the same sequence of kernels every time. After
// kGraphWarmupSteps eager steps (which fill the allocator's cache, pick the
// matmul algorithms and create the optimizer state) one step is captured into a
// CudaGraph (core/cuda_graph.h) and replayed from then on: a step queues the
// batch and learning-rate copies, one graph launch and the loss copy.
// Numerics report steps run eagerly between replays (the report reads tensors
// on the host); evaluation, checkpoints and sampling run between replays, in
// stream order. When the step cannot be captured the run says why in one line
// and stays eager.
#include <iostream>
#include <limits>

#include "core/copy.h"
#include "core/pinned.h"
#include "ops/autocast.h"
#include "optim/adamw.h"
#include "train/trainer.h"

namespace precis::train {

namespace {

constexpr int64_t kGraphWarmupSteps = 3;

}  // namespace

void Trainer::setup_gpu_step() {
  gpu_step_ = device_.is_cuda() && dynamic_cast<optim::AdamW*>(optimizer_.get()) != nullptr;
  if (!gpu_step_) return;
  scaler_->keep_on_device(device_);
  optimizer_->keep_state_on_device(device_);
  loss_sum_ = zeros({}, DType::f64, device_);
  grad_norm_ = zeros({2}, DType::f64, device_);
}

std::string Trainer::graph_fallback_reason() const {
  if (!device_.is_cuda()) return "this run is on the CPU, and CUDA graphs need a GPU";
  if (!gpu_step_) return "the " + config_.optimizer.name + " optimizer has no sync-free GPU step (adamw has)";
  if (config_.model.dropout > 0)
    return "dropout draws its random offset on the host every step (model.dropout is " +
           std::to_string(config_.model.dropout) + "; 0 allows the graph)";
  return "";
}

void Trainer::plan_graphs() {
  if (!config_.cuda_graphs) return;
  const std::string reason = graph_fallback_reason();
  use_graphs_ = reason.empty();
  if (!use_graphs_) {
    std::cerr << "note: cuda_graphs: not used: " << reason << "; the step runs eagerly\n";
    return;
  }
  if (config_.precision.report)
    std::cerr << "note: cuda_graphs: numerics report steps run eagerly (the report reads tensors on the host); "
                 "the other steps replay the graph\n";
}

void Trainer::gpu_train_step(const std::vector<Tensor>& inputs, const std::vector<Tensor>& targets) {
  optimizer_->set_lr(schedule_.at(step_));  // queued ahead of the step's kernels
  if (graph_ && !reporting_) {
    Profiler::Phase phase(profiler_, "graph");
    graph_->replay();
  } else if (use_graphs_ && !graph_ && !reporting_ && eager_gpu_steps_ >= kGraphWarmupSteps) {
    capture_and_replay(inputs, targets);
  } else {
    run_step(inputs, targets, &profiler_);
    ++eager_gpu_steps_;
  }
  queue_loss();
}

void Trainer::capture_and_replay(const std::vector<Tensor>& inputs, const std::vector<Tensor>& targets) {
  auto graph = std::make_unique<CudaGraph>(device_);
  try {
    graph->capture([&] { run_step(inputs, targets, nullptr); });
  } catch (const std::exception& e) {
    // Nothing of the step ran (a capture only records): run it eagerly, and every step after.
    use_graphs_ = false;
    std::cerr << "note: cuda_graphs: not used: " << e.what() << "; the step runs eagerly\n";
    run_step(inputs, targets, &profiler_);
    return;
  }
  ops::autocast::clear_cache();  // the casts made during the capture are the graph's
  graph_ = std::move(graph);
  std::cout << "cuda graphs: captured the training step (" << graph_->num_nodes() << " nodes) after "
            << eager_gpu_steps_ << " eager steps; replaying it from step " << step_ + 1 << std::endl;
  Profiler::Phase phase(profiler_, "graph");
  graph_->replay();
}

void Trainer::queue_loss() {
  Tensor landing = empty_pinned({}, DType::f64);
  copy_(landing, loss_sum_);  // arrives once the step has run
  pending_losses_.emplace_back(losses_.size(), landing);
  losses_.push_back(std::numeric_limits<double>::quiet_NaN());
}

void Trainer::resolve_step_values() {
  if (!gpu_step_) return;
  synchronize(device_);
  for (const auto& [index, landing] : pending_losses_)
    losses_[index] = landing.data<double>()[0] / static_cast<double>(config_.batch.grad_accum);
  pending_losses_.clear();
  last_grad_norm_ = grad_norm_.to_vector<double>()[0];
}

}  // namespace precis::train
