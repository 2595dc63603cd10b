#include "train/trainer.h"

#include <omp.h>

#include <Eigen/Core>
#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <limits>
#include <map>
#include <sstream>

#include "core/autograd.h"
#include "core/copy.h"
#include "core/gpu.h"
#include "core/pinned.h"
#include "distributed/launch.h"
#include "nn/observer.h"
#include "nn/parameter_gate.h"
#include "ops/autocast.h"
#include "ops/elementwise.h"
#include "ops/matmul.h"
#include "ops/tap.h"
#include "optim/adamw.h"
#include "optim/clip_grad.h"
#include "optim/sgd.h"
#include "train/checkpoint.h"
#include "train/device_peak.h"
#include "train/exit_codes.h"
#include "train/image_task.h"
#include "train/interrupt.h"
#include "train/lm_task.h"
#include "train/nonfinite.h"
#include "train/pretrained.h"
#include "train/resume_check.h"
#include "train/resume_schedule.h"
#include "train/run_folder.h"
#include "train/step_trace.h"

namespace precis::train {

namespace fs = std::filesystem;

Trainer::Trainer(TrainConfig config) : config_(std::move(config)) {
  setup_distributed(/*detect=*/true, nullptr);
  setup();
}

Trainer::Trainer(TrainConfig config, std::shared_ptr<distributed::ProcessGroup> group) : config_(std::move(config)) {
  setup_distributed(/*detect=*/false, std::move(group));
  setup();
}

void Trainer::setup() {
  if (config_.threads > 0) {
    omp_set_num_threads(static_cast<int>(config_.threads));
    Eigen::setNbThreads(static_cast<int>(config_.threads));
  }
  profiler_.set_device(device_);
  // Every rank traces its step: rank 0 to profile.trace, rank k to PATH.rankK.json, so that the
  // ranks' timelines (their collectives) can be laid side by side.
  if (!config_.profile.trace.empty())
    step_trace_ = std::make_unique<StepTrace>(rank_trace_path(config_.profile.trace, rank_), device_);
  policy_ = config_.precision.policy;
  ops::set_allow_tf32(policy_.allow_tf32);  // nothing enables TF32 behind the user's back
  ops::set_matmul_autotune(config_.matmul_autotune);
  int capability = device_.is_cuda() ? cuda_compute_capability(device_.index) : 0;
  for (const std::string& warning : policy_.validate(capability))
    if (is_main()) std::cerr << "warning: " << warning << "\n";
  scaler_ = std::make_unique<amp::GradScaler>(config_.precision.scaler, device_);
  if (config_.precision.report_interval == 0) config_.precision.report_interval = config_.log_interval;
  std::error_code out_dir_error;
  fs::create_directories(config_.out_dir, out_dir_error);
  PRECIS_CHECK(!out_dir_error, "out_dir: cannot create '", config_.out_dir, "': ", out_dir_error.message(),
               "; give a folder this user may write (out_dir=PATH)");
  if (config_.checkpoint.dir.empty()) config_.checkpoint.dir = (fs::path(config_.out_dir) / "checkpoints").string();
  if (is_main()) {
    run_lock_ = std::make_unique<RunLock>(config_.out_dir);  // before anything in out_dir is written
    prepare_run_folder(config_);
  }
  if (config_.schedule.decay_steps < 0) {
    config_.schedule.decay_steps = config_.max_steps;
    config_.schedule.decay_steps_from_max_steps = true;
  }
  if (group_) check_same_config_on_every_rank();
  setup_task();
  if (is_main()) save_resolved_config(config_);  // with the vocabulary the data decided
  setup_model();
  setup_step();
}

void Trainer::setup_distributed(bool detect, std::shared_ptr<distributed::ProcessGroup> group) {
  if (detect) {
    const distributed::LaunchInfo launch = distributed::detect_launch();
    device_ = resolve_device(config_.device, /*quiet=*/launch.rank != 0);
    if (launch.distributed()) {
      device_ = distributed::rank_device(launch, device_);
      distributed::ProcessGroupOptions options;
      options.rendezvous_timeout =
          std::chrono::milliseconds(static_cast<int64_t>(1000.0 * config_.distributed.timeout_s));
      options.collective_timeout = options.rendezvous_timeout;
      group = distributed::init_process_group(launch, distributed::parse_backend(config_.distributed.backend), device_,
                                              options);
    }
  } else {
    device_ = resolve_device(config_.device, /*quiet=*/group && group->rank() != 0);
  }
  if (!group || group->world_size() == 1) return;
  PRECIS_CHECK(group->device().is_cuda() == device_.is_cuda(), "distributed: the ", group->backend_name(),
               " process group reduces tensors on ", group->device(), " but this run is on ", device_,
               "; set distributed.backend to match the device (auto picks it)");
  device_ = group->device();
  group_ = std::move(group);
  rank_ = group_->rank();
  world_size_ = group_->world_size();
}

void Trainer::check_same_config_on_every_rank() {
  const BatchConfig& b = config_.batch;
  const std::vector<int64_t> mine = {b.micro_batch, b.seq_len, b.grad_accum, config_.max_steps,
                                     static_cast<int64_t>(config_.seed)};
  const char* names[] = {"batch.micro_batch", "batch.seq_len", "batch.grad_accum", "max_steps", "seed"};
  const int64_t n = static_cast<int64_t>(mine.size());
  Tensor local = from_vector<int64_t>(mine, {n}).to(device_);
  Tensor gathered = empty({n * world_size_}, DType::i64, device_);
  group_->all_gather(gathered, local)->wait();
  group_->synchronize();  // a rank that never joins is an error after distributed.timeout_s
  const std::vector<int64_t> all = gathered.to_vector<int64_t>();
  for (int r = 1; r < world_size_; ++r)
    for (int64_t i = 0; i < n; ++i)
      PRECIS_CHECK(all[r * n + i] == all[i], "distributed: rank ", r, " runs ", names[i], " ", all[r * n + i],
                   " but rank 0 runs ", all[i], "; every rank must run the same config (", names[i],
                   " is per rank: the global batch is world_size times it)");
}

std::vector<double> Trainer::mean_over_ranks(std::vector<double> values) {
  if (!group_ || values.empty()) return values;
  const int64_t n = static_cast<int64_t>(values.size());
  Tensor t = from_vector<double>(values, {n}).to(device_);
  group_->all_reduce(t, distributed::ReduceOp::avg)->wait();
  group_->synchronize();
  return t.to_vector<double>();
}

Trainer::~Trainer() = default;

void Trainer::setup_task() {
  if (config_.task == "image_classification") {
    // Channels-last pays where the convolutions run on tensor cores in f16/bf16 (cuDNN's NHWC kernels).
    const bool low_precision = policy_.compute_dtype == DType::f16 || policy_.compute_dtype == DType::bf16;
    const bool channels_last =
        config_.channels_last == "auto" ? device_.is_cuda() && low_precision : config_.channels_last == "true";
    // The loader thread makes batches in pinned memory on a GPU, but not when a CUDA graph will be
    // captured: no pinned memory can be taken from CUDA during a capture, and the thread does not
    // know when one is under way (the trainer then stages each batch itself, between steps).
    const bool pinned = device_.is_cuda() && !config_.cuda_graphs;
    task_ = std::make_unique<ImageTask>(config_, rank_, world_size_, channels_last, policy_, pinned);
  } else {
    task_ = std::make_unique<LmTask>(config_, rank_, world_size_, group_.get());
  }
}

models::GPT2& Trainer::gpt2() {
  auto* lm = dynamic_cast<LmTask*>(task_.get());
  PRECIS_CHECK(lm, "Trainer::gpt2: this run's task is ", config_.task, ", not language_model");
  return lm->gpt2();
}

void Trainer::setup_model() {
  std::optional<DType> param_dtype;
  if (policy_.param_dtype != DType::f32) param_dtype = policy_.param_dtype;
  // ZeRO-1 pads every flat buffer into world_size equal shards (distributed/zero.h).
  const bool zero = group_ && config_.distributed.zero == 1;
  // ZeRO-1 all-gathers the parameter buffers every step: in memory NCCL writes in place.
  std::shared_ptr<Allocator> registered = zero ? group_->registered_allocator() : nullptr;
  flat_ = nn::flatten_parameters(model(), device_, param_dtype, zero ? world_size_ : 1, policy_.grad_dtype, registered);
  registered_bytes_ = registered ? static_cast<int64_t>(registered->stats().allocated_bytes) : 0;
  if (!config_.init_from.empty()) {
    // Fine-tuning: the weights only; the optimizer, data position and step start fresh.
    const PretrainedSource source = inspect_pretrained(config_.init_from);
    load_pretrained(source, gpt2());
    if (is_main()) std::cout << "init_from: " << source.format << " weights of " << source.path << "\n";
  }
  if (group_) {
    // Before the optimizer copies them (master weights): every rank starts from rank 0's parameters.
    distributed::broadcast_parameters(*flat_, *group_);
    const DistributedConfig& dist = config_.distributed;
    distributed::ReducerOptions options;
    options.bucket_sizes.first_bytes = static_cast<int64_t>(dist.first_bucket_mb * (1 << 20));
    options.bucket_sizes.bytes = static_cast<int64_t>(dist.bucket_mb * (1 << 20));
    options.reduce_dtype = policy_.grad_reduce_dtype;
    options.shard = zero;
    reducer_ = std::make_unique<distributed::Reducer>(flat_, group_, options);
    if (zero) zero_ = std::make_unique<distributed::Zero1>(flat_, group_, *reducer_);
  }
  const OptimizerConfig& o = config_.optimizer;
  auto groups = optim::default_param_groups(model(), o.weight_decay);
  if (zero_) groups = zero_->shard_groups(groups);  // the optimizer steps this rank's shard only
  if (o.name == "adamw") {
    optim::AdamWOptions options{o.lr, o.beta1, o.beta2, o.eps};
    options.master_weights = policy_.master_weights;
    options.stochastic_rounding = config_.precision.stochastic_rounding;
    options.seed = config_.seed;
    optimizer_ = std::make_unique<optim::AdamW>(groups, options);
  } else {
    optimizer_ = std::make_unique<optim::SGD>(
        groups, optim::SGDOptions{.lr = o.lr, .momentum = o.momentum, .dampening = 0.0, .nesterov = o.nesterov});
  }
  if (policy_.autocasts() && o.writes_weight_casts && !zero_) setup_weight_casts();
  const FusedGather fused = config_.distributed.fused_gather;
  const bool want_fused = fused == FusedGather::on || (fused == FusedGather::where_possible && !gather_overlap());
  if (zero_ && want_fused && !zero_->fuse_gather_into(*optimizer_, fused_gather_why_) && fused == FusedGather::on &&
      is_main())
    std::cerr << ("note: distributed.fused_gather: not used: " + fused_gather_why_ +  // one write: not
                  "; the parameters are all-gathered after the optimizer\n");         // cut by stdout's lines
  schedule_ = optim::LrSchedule{config_.schedule.kind,        o.lr,
                                config_.schedule.min_lr,      config_.schedule.warmup_steps,
                                config_.schedule.decay_steps, config_.schedule.decay_fraction};
}

void Trainer::setup_weight_casts() {
  // Each parameter's copy is its view of its buffer's cast, at its offset, with its strides.
  std::map<const void*, Tensor> copy_of;  // by the parameter's TensorImpl
  for (const nn::FlatBuffer& b : flat_->buffers()) {
    if (!is_floating(b.dtype)) {
      weight_casts_.emplace_back();
      continue;
    }
    const Tensor cast = empty({b.data.numel()}, policy_.compute_dtype, device_);
    for (const nn::FlatSlot& s : b.slots)
      copy_of[s.param.impl()] = cast.as_strided(s.param.shape(), s.param.strides(), s.param.offset() - b.data.offset());
    weight_casts_.push_back(cast);
  }
  std::vector<Tensor> copies;
  for (const optim::ParamGroup& group : optimizer_->param_groups())
    for (const Tensor& p : group.params) {
      const auto it = copy_of.find(p.impl());
      copies.push_back(it == copy_of.end() ? Tensor() : it->second);
    }
  optimizer_->set_compute_copies(std::move(copies));
}

void Trainer::setup_step() {
  loss_sum_ = zeros({}, DType::f64, device_);
  grad_norm_ = zeros({2}, DType::f64, device_);
}

namespace {

// `host` (a CPU batch) into the device buffer `dst` through pinned memory: the copy is queued
// on the compute stream and the host moves on (the pinned allocator holds the staging buffer
// until the copy has run). A batch the loader already made in pinned memory (never written
// again) is copied from where it is.
void stage(const Tensor& dst, const Tensor& host) {
  if (is_pinned(host)) {
    copy_(dst, host);
    return;
  }
  Tensor pinned = empty_pinned(host.shape(), host.dtype());
  copy_(pinned, host);
  copy_(dst, pinned);
}

}  // namespace

void Trainer::stage_batches(std::vector<Tensor>& inputs, std::vector<Tensor>& targets) {
  for (size_t micro = 0; micro < static_cast<size_t>(config_.batch.grad_accum); ++micro) {
    TaskBatch batch = task_->next_batch();
    if (!device_.is_cuda()) {
      inputs.push_back(batch.inputs);
      targets.push_back(batch.targets);
      continue;
    }
    // Fixed buffers, made once: a captured step reads its batches from these addresses.
    if (device_inputs_.size() == micro) {
      device_inputs_.push_back(empty(batch.inputs.shape(), batch.inputs.dtype(), device_));
      device_targets_.push_back(empty(batch.targets.shape(), batch.targets.dtype(), device_));
      staged_inputs_.emplace_back();
    }
    // A task that gives the same host batch every step (synthetic images) is copied once.
    if (staged_inputs_[micro].impl_ptr() == batch.inputs.impl_ptr()) continue;
    staged_inputs_[micro] = batch.inputs;
    stage(device_inputs_[micro], batch.inputs);
    stage(device_targets_[micro], batch.targets);
  }
  if (device_.is_cuda()) {
    inputs = device_inputs_;
    targets = device_targets_;
  }
}

void Trainer::train_step() {
  std::vector<Tensor> inputs, targets;
  {
    Profiler::Phase phase(profiler_, "data");
    stage_batches(inputs, targets);
  }
  optimizer_->set_lr(schedule_.at(step_));  // queued ahead of the step's kernels
  step_graph_->run([&](Profiler* profiler) { run_step(inputs, targets, profiler); }, profiler_, reporting_);
  // A replayed step ran no host code: its optimizer left the parameters pending, as finish_step says.
  if (gather_overlap() && step_graph_->replaying()) zero_->defer_gather();
  queue_loss();
}

void Trainer::queue_loss() {
  Tensor landing = empty_pinned({}, DType::f64);
  copy_(landing, loss_sum_);  // on a GPU: arrives once the step has run
  pending_losses_.emplace_back(losses_.size(), landing);
  losses_.push_back(std::numeric_limits<double>::quiet_NaN());
}

void Trainer::resolve_step_values() {
  // The watchdog: the steps' collectives must complete within distributed.timeout_s.
  if (group_) group_->synchronize();
  synchronize(device_);
  std::vector<double> losses;
  for (const auto& [index, landing] : pending_losses_)
    losses.push_back(landing.data<double>()[0] / static_cast<double>(config_.batch.grad_accum));
  losses = mean_over_ranks(std::move(losses));  // each rank's mean over its rows -> the global batch's
  for (size_t i = 0; i < losses.size(); ++i) losses_[pending_losses_[i].first] = losses[i];
  pending_losses_.clear();
  last_grad_norm_ = grad_norm_.to_vector<double>()[0];
}

std::string Trainer::graph_fallback_reason() const {
  if (!device_.is_cuda()) return "this run is on the CPU, and CUDA graphs need a GPU";
  return task_->graph_fallback_reason();
}

namespace {

// Fault injection for the tests of the fault watchdog (docs/distributed.md, "Faults"):
// PRECIS_FAULT_STOP=RANK:STEP makes that rank stop itself (SIGSTOP, as a hung process
// would: alive, holding its connections, answering nothing) as it begins that step, so the
// others' collectives wait on it mid-training; PRECIS_FAULT_STOP=RANK:STEP:gather, after
// queueing that step's optimizer and before its parameters' gather (ZeRO-1: the others wait
// in the all-gather, or in the fused gather's barrier kernel). Unset in any real run.
void stop_if_asked(int rank, int64_t step, const char* where = "start") {
  static const char* setting = std::getenv("PRECIS_FAULT_STOP");
  if (setting == nullptr) return;
  int asked_rank = -1;
  long long asked_step = -1;
  char asked_where[16] = "start";
  if (std::sscanf(setting, "%d:%lld:%15s", &asked_rank, &asked_step, asked_where) >= 2 && asked_rank == rank &&
      asked_step == step && std::strcmp(asked_where, where) == 0) {
    // One string, one write: under mpirun another rank's output cuts between the writes of a << chain.
    const std::string line = "PRECIS_FAULT_STOP: rank " + std::to_string(rank) + " stops itself at step " +
                             std::to_string(step) +
                             (std::strcmp(where, "start") == 0 ? "" : std::string(" before its ") + where) + "\n";
    std::cerr << line << std::flush;
    std::raise(SIGSTOP);
  }
}

// A profiler phase, or nothing without a profiler (work recorded into a CUDA graph cannot be timed).
class MaybePhase {
 public:
  MaybePhase(Profiler* profiler, const char* name) : profiler_(profiler) {
    if (profiler_) profiler_->begin(name);
  }
  ~MaybePhase() {
    if (profiler_) profiler_->end();
  }
  MaybePhase(const MaybePhase&) = delete;
  MaybePhase& operator=(const MaybePhase&) = delete;

 private:
  Profiler* profiler_;
};

}  // namespace

void Trainer::run_step(const std::vector<Tensor>& inputs, const std::vector<Tensor>& targets, Profiler* profiler) {
  flat_->zero_grad_lazily();  // each first gradient is written, not added to zeros
  // Under data parallelism the buckets' all-reduces are launched from the backward's hooks on
  // the communication stream; a captured step records them (NCCL calls can be captured) as a
  // branch of the graph that joins the step before the optimizer, untimed. A lone bucket, and
  // every bucket without overlap, is reduced after the backward in order on the compute stream
  // instead (distributed/process_group.h, "Launch"), as is ZeRO-1's gather when not deferred.
  // The first step of this process times its products (matmul_autotune): its buckets are
  // reduced after the backward, and its parameters gathered before the forward, so no NCCL
  // kernel skews those timings. distributed.reduce_overlap=false reduces them after the
  // backward in every step (the backward then shares no SM with NCCL; with gather_overlap,
  // several buckets still cut the all-gather into pieces behind the next forward).
  const bool overlap_comm = (steps_run_ > 0 || !config_.matmul_autotune) && config_.distributed.reduce_overlap;
  if (reducer_) {
    reducer_->set_profiler(profiler);
    reducer_->set_overlap(overlap_comm);
  }
  ++steps_run_;
  // distributed.gather_overlap: the last step's all-gather runs behind this forward, each
  // module waiting for its parameters' buckets (distributed/zero.h). The weight casts below
  // read every parameter, so under autocast the gather completes first (nothing to overlap).
  // Every step launches it, even after something outside the step completed it (an
  // evaluation): a captured step must hold it for its replays.
  std::optional<nn::ParameterGateScope> gate;
  if (gather_overlap()) {
    zero_->launch_gather();
    if (policy_.autocasts() || !overlap_comm)
      zero_->complete_gather();
    else
      gate.emplace([this](const nn::Module& module) { zero_->wait_for(module); });
  }
  ops::autocast::clear_cache();  // the weights changed in the last step
  if (policy_.autocasts()) {
    // This step's weight casts: one kernel per flat buffer instead of one per weight, or none
    // where the last step's optimizer wrote them (optimizer.writes_weight_casts).
    const std::vector<nn::FlatBuffer>& buffers = flat_->buffers();
    for (size_t i = 0; i < buffers.size(); ++i) {
      const nn::FlatBuffer& b = buffers[i];
      if (!is_floating(b.dtype)) continue;
      std::vector<Tensor> leaves;
      for (const nn::FlatSlot& s : b.slots) leaves.push_back(s.param);
      const Tensor cast = weight_casts_.empty() ? Tensor() : weight_casts_[i];
      if (cast.defined() && !weight_casts_current_) copy_(cast, b.data);  // the first step, or after a resume
      ops::autocast::precache(b.data, leaves, policy_.compute_dtype, cast);
    }
  }
  const int64_t accum = config_.batch.grad_accum;
  fill_(loss_sum_, 0.0);
  // The gradient each micro-batch's loss receives: 1/accum of the step's mean, times the loss
  // scale (read from device memory on the GPU). The fused classifier makes the logits'
  // gradient with it in the loss's own pass; otherwise the backward starts from the loss.
  const Tensor loss_gradient = task_->fuses_loss_gradient()
                                   ? scaler_->scale(full({}, 1.0 / static_cast<double>(accum), DType::f32, device_))
                                   : Tensor();
  for (int64_t micro = 0; micro < accum; ++micro) {
    if (reporting_ && micro == 0) start_numerics();
    TaskLoss out;
    Tensor loss;
    {
      MaybePhase phase(profiler, "forward");
      ops::autocast::Scope autocast(policy_.compute_dtype, policy_.autocasts());
      out = task_->forward(inputs[micro], targets[micro], loss_gradient);
      loss = out.loss;
      // The sum stays on the device (f64): no read-back per micro-batch.
      accumulate_(loss_sum_, loss);
      // Buckets no module waited for (none in the models here) before the backward reads them;
      // in a captured step this joins the communication stream back into the graph.
      if (gate) zero_->complete_gather();
    }
    nn::set_activation_observer(nullptr);
    {
      MaybePhase phase(profiler, "backward");
      // Only the last micro-step's backward reduces: the gradients summed over the micro-steps.
      std::optional<distributed::NoSync> no_sync;
      if (reducer_ && micro + 1 < accum) no_sync.emplace(*reducer_);
      if (out.backward_grad.defined()) {
        autograd::backward(out.backward_output, out.backward_grad, /*retain_graph=*/false);
      } else {
        // Each micro-batch contributes 1/accum of the step's mean gradient, times the loss scale.
        if (accum > 1) loss = ops::mul(loss, 1.0 / static_cast<double>(accum));
        scaler_->scale(loss).backward();
      }
    }
  }
  if (reducer_) {
    // Waits for the buckets' all-reduces still running once the backward is done: the
    // communication the backward did not hide.
    MaybePhase phase(profiler, "comm_exposed");
    reducer_->finish();
  }
  flat_->settle_grads();  // zeros for the parameters no micro-batch reached
  std::vector<Tensor> params_before;
  if (reporting_) {
    for (const auto& b : flat_->buffers())
      for (const auto& s : b.slots)
        numerics_.record(amp::NumericsKind::gradient, amp::layer_of(s.name), s.param.grad());
    for (const Tensor& p : model().parameters()) params_before.push_back(p.detach().clone());
  }
  finish_step(profiler);
  if (reporting_) {
    if (zero_) zero_->complete_gather();  // the report compares the whole parameters
    finish_numerics(params_before);
  }
}

// The same calls on both devices, nothing read back, and no pass over the gradients but the
// norm's and the optimizer's: the unscale and the inf/NaN check are folded into the norm (the
// norm of the scaled gradients is the unscaled norm times the scale, and it is finite exactly
// when every gradient is, so it sets the scaler's found_inf), and the optimizer multiplies each
// gradient by clip / scale as it reads it, skipping the whole step when found_inf is set.
void Trainer::finish_step(Profiler* profiler) {
  {
    MaybePhase phase(profiler, "optimizer");
    const Tensor found_inf = scaler_->found_inf();  // set on inf/NaN gradients under every policy
    if (zero_) {
      // The shard's gradients, their sum of squares summed over the ranks: the whole gradient's norm.
      std::vector<Tensor> shard_params;
      for (const optim::ParamGroup& group : optimizer_->param_groups())
        shard_params.insert(shard_params.end(), group.params.begin(), group.params.end());
      optim::clip_grad_norm(shard_params, config_.optimizer.grad_clip, scaler_->scale_tensor(), found_inf, grad_norm_,
                            [this](const Tensor& sum) { zero_->sum_over_ranks(sum); });
    } else {
      optim::clip_grad_norm(model().parameters(), config_.optimizer.grad_clip, scaler_->scale_tensor(), found_inf,
                            grad_norm_);
    }
    optimizer_->step({.grad_factor = grad_norm_.select(0, 1),
                      .skip_if = found_inf,
                      .round_scaled_grads_to_f32 = zero_ && zero_->grads_staged()});
    weight_casts_current_ = true;  // written with the weights (a skipped step changed neither)
    stop_if_asked(rank_, step_ + 1, "gather");
    // Every rank's updated shard into every rank's parameters, now or behind the next forward.
    if (gather_overlap())
      zero_->defer_gather();
    else if (zero_)
      zero_->gather_parameters();
  }
  // Without loss scaling the update only counts a skipped non-finite step (train/nonfinite.h).
  MaybePhase phase(scaler_->enabled() ? profiler : nullptr, "scaler");
  scaler_->update();
}

// What ZeRO-1 saves: the optimizer state this rank holds against the whole, unsharded state.
void Trainer::print_zero_line() const {
  int64_t mine = 0, all = 0;
  for (size_t b = 0; b < flat_->buffers().size(); ++b) {
    const int64_t per_element = optimizer_->state_bytes_per_element(flat_->buffers()[b].dtype);
    mine += per_element * zero_->shard_elements(b);
    all += per_element * zero_->total_elements(b);
  }
  std::cout << "data parallel: " << world_size_ << " ranks (" << group_->backend_name() << "), rank 0 on " << device_
            << "; the batch below is per rank; ZeRO-1: " << reducer_->buckets().size()
            << " gradient buckets, reduce-scattered in " << dtype_name(policy_.grad_reduce_dtype)
            << ", optimizer state " << mine << " bytes (" << static_cast<double>(mine) / (1 << 20)
            << " MiB) on rank 0 of " << all << " bytes (" << static_cast<double>(all) / (1 << 20) << " MiB) unsharded"
            << (zero_->gather_fused() ? "; the optimizer stores each update into every rank's parameters (fused gather)"
                                      : "")
            << "\n";
}

bool Trainer::report_due() const {
  return config_.precision.report && (step_ % config_.precision.report_interval == 0 || step_ + 1 == config_.max_steps);
}

// Watches the first micro-batch of a report step: each layer's output on the way
// forward and its gradient on the way back.
void Trainer::start_numerics() {
  numerics_.clear();
  nn::set_activation_observer([this](const std::string& name, const Tensor& x) {
    return ops::tap(
        x, [this, name](const Tensor& t) { numerics_.record(amp::NumericsKind::activation, name, t); },
        [this, name](const Tensor& g) { numerics_.record(amp::NumericsKind::activation_grad, name, g); });
  });
}

void Trainer::finish_numerics(const std::vector<Tensor>& params_before) {
  auto named = model().named_parameters();
  for (size_t i = 0; i < named.size(); ++i)
    numerics_.record_update(amp::layer_of(named[i].name), params_before[i], named[i].tensor, named[i].tensor.grad());
  std::cout << numerics_.table(step_ + 1, scaler_->scale());
  if (!numerics_out_.is_open())
    numerics_out_.open((fs::path(config_.out_dir) / "numerics.jsonl").string(), /*append=*/true);
  for (const Json& row : numerics_.json(step_ + 1, scaler_->scale())) numerics_out_.write(row);
}

int64_t Trainer::peak_memory_bytes() const {
  // The registered buffers live from setup to the end, so they add to every peak. The
  // allocator's own peak restarts at each log line (the interval's peak, in the report).
  return std::max(peak_before_interval_,
                  static_cast<int64_t>(allocator_for(device_).stats().peak_bytes) + registered_bytes_);
}

double Trainer::evaluate() {
  if (!task_->has_validation()) return std::nan("");
  if (zero_) zero_->complete_gather();
  NoGradGuard no_grad;
  model().eval();
  EvalTotals totals = task_->evaluate();
  model().train();
  // Each rank saw its own rows or batches: the means of the sums are in the ratio of the sums.
  const std::vector<double> sums =
      mean_over_ranks({totals.loss_sum, totals.loss_count, totals.correct, totals.examples});
  last_val_accuracy_.reset();
  if (sums[3] > 0) last_val_accuracy_ = sums[2] / sums[3];
  return sums[1] > 0 ? sums[0] / sums[1] : 0.0;
}

std::string Trainer::sample(const std::string& prompt, int64_t tokens) {
  auto* lm = dynamic_cast<LmTask*>(task_.get());
  PRECIS_CHECK(lm, "sample: this run's task is ", config_.task, "; only a language model generates text");
  if (zero_) zero_->complete_gather();
  return lm->sample(prompt, tokens);
}

Json Trainer::train_state() const {
  Json state = task_->state();  // the data position, random streams, model config, tokenizer
  state["task"] = config_.task;
  state["step"] = step_;
  state["scaler"] = scaler_->state();
  state["schedule"] = schedule_.to_json();
  state["precision"] = policy_.describe();
  state["optimizer"] = config_.optimizer.name;
  state["param_dtype"] = dtype_name(policy_.param_dtype);
  state["master_weights"] = policy_.master_weights;
  state["config_path"] = config_.config_path;
  return state;
}

void Trainer::check_nonfinite() { enforce_nonfinite_rule(config_, step_, scaler_->consecutive_overflows()); }

void Trainer::save_checkpoint() {
  check_nonfinite();  // every rank: the same gradients, so the same count and the same decision
  if (zero_) {
    zero_->complete_gather();  // the model's parameters are saved whole
    // Every rank gives its shard; rank 0 writes the whole state, as an unsharded run would.
    const std::map<std::string, Tensor> state = zero_->gather_state(optimizer_->state_dict());
    if (is_main())
      train::save_checkpoint(config_.checkpoint.dir, step_, task_->checkpoint_model(), state, train_state(),
                             config_.checkpoint.keep_last);
    return;
  }
  if (!is_main()) return;  // every rank holds the same parameters and optimizer state
  train::save_checkpoint(config_.checkpoint.dir, step_, task_->checkpoint_model(), optimizer_.get(), train_state(),
                         config_.checkpoint.keep_last);
}

bool Trainer::try_resume() {
  if (!config_.checkpoint.resume) return false;
  if (!fs::exists(fs::path(config_.checkpoint.dir) / "latest")) {
    if (is_main())
      std::cerr << "note: resume requested but no checkpoint in '" << config_.checkpoint.dir
                << "' yet; starting from step 0\n";
    return false;
  }
  check_resume_compatible(read_train_state(config_.checkpoint.dir), config_, policy_,
                          resolve_checkpoint(config_.checkpoint.dir));
  // The checkpoint holds the whole optimizer state (of any world size, sharded or not): under
  // ZeRO-1 each rank takes its shard of it.
  OptimizerStateLoader load_optimizer = [this](const std::map<std::string, Tensor>& full) {
    optimizer_->load_state_dict(zero_ ? zero_->shard_state(full) : full);
  };
  Json state = load_checkpoint_into(config_.checkpoint.dir, task_->checkpoint_model(), load_optimizer);
  weight_casts_current_ = false;  // the weights are the checkpoint's now
  const std::string saved_task = state.contains("task") ? state.at("task").as_string() : "language_model";
  PRECIS_CHECK(saved_task == config_.task, "checkpoint in '", config_.checkpoint.dir, "' was written by a ", saved_task,
               " run; this run is ", config_.task, "; resume with the same task or another checkpoint.dir");
  step_ = state.at("step").as_int();
  task_->restore(state);
  if (state.contains("scaler")) scaler_->load_state(state.at("scaler"));
  const ResumedSchedule resumed = resumed_schedule(
      schedule_, config_.schedule.decay_steps_from_max_steps,
      state.contains("schedule") ? std::optional(optim::LrSchedule::from_json(state.at("schedule"))) : std::nullopt);
  schedule_ = resumed.schedule;
  if (is_main())
    std::cout << "resumed from " << config_.checkpoint.dir << " at step " << step_ << "\n" << resumed.line << "\n";
  return true;
}

void Trainer::log_interval(double loss, double grad_norm, double lr, double interval_seconds, int64_t steps_in_interval,
                           std::optional<double> val_loss) {
  StepReport r;
  r.step = step_;
  r.max_steps = config_.max_steps;
  r.loss = loss;
  r.lr = lr;
  r.grad_norm = grad_norm;
  double steps = static_cast<double>(std::max<int64_t>(steps_in_interval, 1));
  r.ms = 1000.0 * interval_seconds / steps;
  // Every rank's tokens (or images); TFLOP/s and MFU below are per device.
  double items_per_step = static_cast<double>(task_->items_per_batch() * config_.batch.grad_accum * world_size_);
  r.items_per_s = items_per_step * steps / std::max(interval_seconds, 1e-9);
  r.item_unit = task_->item_unit();
  for (auto& [name, ms] : profiler_.take_ms()) r.phase_ms.emplace_back(name, ms / steps);
  if (task_->train_flops_per_item() > 0)
    r.tflops = task_->train_flops_per_item() * r.items_per_s / static_cast<double>(world_size_) / 1e12;
  if (device_.is_cuda() && r.tflops) {
    double peak = device_peak_tflops(device_, policy_.compute_dtype, policy_.allow_tf32);
    if (peak > 0) r.mfu = *r.tflops / peak;
  }
  r.val_loss = val_loss;
  if (val_loss) r.val_accuracy = last_val_accuracy_;
  // Every rank runs the same task, so all of them take part in the mean or none.
  if (std::optional<double> accuracy = task_->last_train_accuracy()) r.accuracy = mean_over_ranks({*accuracy})[0];
  if (scaler_->enabled()) r.loss_scale = scaler_->scale();
  r.skipped_steps = scaler_->skipped_steps();
  r.peak_memory_bytes = peak_memory_bytes();
  const AllocatorStats allocator = allocator_for(device_).stats();
  // The interval's own peak (what PyTorch's max_memory_allocated gives after a reset at the
  // interval's start); the next interval's starts from what is live now.
  r.interval_peak_memory_bytes = static_cast<int64_t>(allocator.peak_bytes) + registered_bytes_;
  peak_before_interval_ = r.peak_memory_bytes;
  allocator_for(device_).reset_peak();
  r.reserved_memory_bytes = static_cast<int64_t>(allocator.reserved_bytes) + registered_bytes_;
  r.system_allocs = static_cast<int64_t>(allocator.num_system_allocs);
  r.system_frees = static_cast<int64_t>(allocator.num_system_frees);
  r.eta_s = r.ms / 1000.0 * static_cast<double>(config_.max_steps - step_);
  if (is_main()) {
    std::cout << r.line() << std::endl;
    metrics_.write(r.json());
  }
  reports_.push_back(r);
}

int Trainer::pending_interrupt(bool log_step) {
  const int local = interrupt_signal();
  if (!group_) return local;
  if (!log_step) return 0;
  const bool any = mean_over_ranks({static_cast<double>(local)})[0] > 0;
  return any ? (local != 0 ? local : SIGTERM) : 0;
}

void Trainer::stop_on_signal(int signal, bool checkpoint_written) {
  if (!checkpoint_written) save_checkpoint();
  const std::string where = (fs::path(config_.checkpoint.dir) / checkpoint_step_name(step_)).string();
  throw StoppedRun(detail::concat("interrupted by ", signal_name(signal), " after step ", step_,
                                  ": checkpoint written to ", where, "; continue the run with checkpoint.resume=true"),
                   exit_code_for_signal(signal));
}

void Trainer::profile_ops(OpProfile* profile, int64_t first_step) {
  PRECIS_CHECK(!config_.cuda_graphs, "profiling ops times every op, which a replayed CUDA graph hides; ",
               "set cuda_graphs=false");
  op_profile_ = profile;
  op_profile_from_ = first_step;
}

void Trainer::run() {
  InterruptScope interrupts;
  // However run() ends, it is done with out_dir: another run may start there.
  struct ReleaseLock {
    std::unique_ptr<RunLock>& lock;
    ~ReleaseLock() { lock.reset(); }
  } release_lock{run_lock_};
  try_resume();
  if (is_main()) {
    // The rows of the steps this run will redo go (a fresh run's folder has none: run_folder.h).
    for (const char* file : kRunLogFiles) drop_rows_after_step((fs::path(config_.out_dir) / file).string(), step_);
    metrics_.open((fs::path(config_.out_dir) / "metrics.jsonl").string(), /*append=*/true);
  }
  if (is_main() && group_ && !zero_)
    std::cout << "data parallel: " << world_size_ << " ranks (" << group_->backend_name() << "), rank 0 on " << device_
              << "; the batch below is per rank; " << reducer_->buckets().size() << " gradient buckets, reduced in "
              << dtype_name(policy_.grad_reduce_dtype) << "\n";
  if (is_main() && zero_) print_zero_line();
  if (is_main())
    std::cout << "precis: " << task_->describe() << " on " << device_ << "; " << task_->data_description() << "\n"
              << "precision " << policy_.describe() << "\n";
  // The notes about the graph come from rank 0 (every rank takes the same path).
  const std::string fallback = graph_fallback_reason();
  step_graph_ = std::make_unique<StepGraph>(device_, config_.cuda_graphs && (is_main() || fallback.empty()), fallback,
                                            config_.precision.report && is_main());
  // An unknown GPU's peak is measured now, outside the timed steps and the memory peak.
  device_peak_tflops(device_, policy_.compute_dtype, policy_.allow_tf32);
  using Clock = std::chrono::steady_clock;
  auto interval_start = Clock::now();
  int64_t interval_steps = 0;
  allocator_for(device_).reset_peak();
  const ProfileConfig& profile = config_.profile;
  bool tracing = false;  // from profile.trace_step on (a run resumed past it traces nothing)
  while (step_ < config_.max_steps) {
    stop_if_asked(rank_, step_ + 1);
    reporting_ = report_due() && is_main();  // the report is printed and written by rank 0
    if (step_trace_ && step_ + 1 == profile.trace_step) {
      step_trace_->begin(profiler_);
      tracing = true;
    }
    const bool profiling_ops = op_profile_ && step_ + 1 >= op_profile_from_;
    if (profiling_ops) op_profile_->begin_step();
    train_step();
    if (profiling_ops) op_profile_->end_step();
    if (tracing && step_ + 1 == profile.trace_step + profile.trace_steps - 1) {
      std::ostringstream others;  // only rank 0 prints its kernel table
      step_trace_->end(profiler_, profile.trace_step, step_ + 1,
                       is_main() ? static_cast<std::ostream&>(std::cout) : others);
      tracing = false;
    }
    ++step_;
    ++interval_steps;
    bool eval_now = task_->has_validation() && config_.eval_interval > 0 &&
                    (step_ % config_.eval_interval == 0 || step_ == config_.max_steps);
    bool log_now = step_ % config_.log_interval == 0 || step_ == config_.max_steps || eval_now;
    if (log_now) {
      resolve_step_values();  // waits for the queued steps, so the interval's time is theirs
      double seconds = std::chrono::duration<double>(Clock::now() - interval_start).count();
      std::optional<double> val_loss;
      if (eval_now) val_loss = evaluate();
      if (val_loss && step_ == config_.max_steps) final_val_loss_ = *val_loss;
      log_interval(losses_.back(), last_grad_norm_, optimizer_->lr(), seconds, interval_steps, val_loss);
      interval_start = Clock::now();
      interval_steps = 0;
    }
    if (log_now || step_ % config_.max_nonfinite_steps == 0) check_nonfinite();
    const bool checkpoint_now = config_.checkpoint.interval > 0 && step_ % config_.checkpoint.interval == 0;
    if (checkpoint_now) save_checkpoint();
    if (const int signal = pending_interrupt(log_now)) stop_on_signal(signal, checkpoint_now);
  }
  if (!task_->has_validation()) final_val_loss_ = std::nan("");
  if (zero_) zero_->complete_gather();  // the run ends with whole parameters, for whatever reads them next
  check_nonfinite();
  if (config_.checkpoint.save_final) save_checkpoint();
  if (is_main()) task_->finish();
}

}  // namespace precis::train
