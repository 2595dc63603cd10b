#include "train/trainer.h"

#include <omp.h>

#include <Eigen/Core>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <limits>

#include "core/autograd.h"
#include "core/copy.h"
#include "core/gpu.h"
#include "core/pinned.h"
#include "data/char_tokenizer.h"
#include "data/gpt2_tokenizer.h"
#include "data/tokenize.h"
#include "distributed/launch.h"
#include "nn/observer.h"
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
#include "train/interrupt.h"
#include "train/nonfinite.h"
#include "train/resume_check.h"
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
  if (!config_.profile.trace.empty() && is_main())
    step_trace_ = std::make_unique<StepTrace>(config_.profile.trace, device_);
  policy_ = config_.precision.policy;
  ops::set_allow_tf32(policy_.allow_tf32);  // nothing enables TF32 behind the user's back
  ops::set_matmul_autotune(config_.matmul_autotune);
  int capability = device_.is_cuda() ? cuda_compute_capability(device_.index) : 0;
  for (const std::string& warning : policy_.validate(capability))
    if (is_main()) std::cerr << "warning: " << warning << "\n";
  scaler_ = std::make_unique<amp::GradScaler>(config_.precision.scaler, device_);
  if (config_.precision.report_interval == 0) config_.precision.report_interval = config_.log_interval;
  fs::create_directories(config_.out_dir);
  if (config_.checkpoint.dir.empty()) config_.checkpoint.dir = (fs::path(config_.out_dir) / "checkpoints").string();
  if (is_main()) {
    run_lock_ = std::make_unique<RunLock>(config_.out_dir);  // before anything in out_dir is written
    prepare_run_folder(config_);
  }
  if (config_.schedule.decay_steps < 0) config_.schedule.decay_steps = config_.max_steps;
  if (group_) check_same_config_on_every_rank();
  setup_data();
  if (is_main()) save_resolved_config(config_);  // with the vocabulary the data decided
  setup_model();
  setup_step();
  if (config_.batch.seq_len < config_.model.block_size && is_main())
    std::cerr << "note: seq_len " << config_.batch.seq_len << " < block_size " << config_.model.block_size
              << ": positions from " << config_.batch.seq_len << " on are never trained, so samples longer than "
              << config_.batch.seq_len << " tokens degrade; set block_size to seq_len for sampling\n";
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

void Trainer::setup_data() {
  const DataConfig& d = config_.data;
  if (!d.text_file.empty()) {
    // Tokenise the text into shards under out_dir/data (fast: a char vocabulary
    // is immediate, GPT-2 BPE takes about a second for tinyshakespeare).
    fs::path dir = fs::path(config_.out_dir) / "data";
    fs::create_directories(dir);
    std::string prefix = (dir / (fs::path(d.text_file).stem().string() + "_" + d.tokenizer)).string();
    // One rank writes the shards, the others read them once it is done.
    if (is_main()) tokenize_file(d.text_file, prefix, d.tokenizer, d.val_fraction, /*quiet=*/true);
    if (group_) group_->barrier();
    train_files_ = {prefix + "_train.bin"};
    val_files_ = {prefix + "_val.bin"};
    if (d.tokenizer == "char") {
      auto tok = std::make_unique<CharTokenizer>(CharTokenizer::load(prefix + "_vocab.json"));
      tokenizer_json_ = tok->to_json();
      tokenizer_ = std::move(tok);
    }
  } else {
    train_files_ = find_token_files(d.train_bin);
    if (!d.val_bin.empty()) val_files_ = find_token_files(d.val_bin);
  }
  if (!tokenizer_) {
    tokenizer_ = std::make_unique<GPT2Tokenizer>();
    tokenizer_json_ = Json::object();
    tokenizer_json_["tokenizer"] = "gpt2";
  }
  config_.model.vocab_size = tokenizer_->vocab_size();

  TokenDatasetOptions train_options;
  train_options.batch_size = config_.batch.micro_batch;
  train_options.seq_len = config_.batch.seq_len;
  train_options.shuffle = d.order == "random";
  train_options.seed = config_.seed;
  train_options.prefetch = d.prefetch;
  // Rank r takes rows r*B..r*B+B-1 of each global batch of B*world_size windows; the
  // dataset's position counts global windows, the same on every rank.
  train_options.rank = rank_;
  train_options.world_size = world_size_;
  train_options.vocab_size = config_.model.vocab_size;
  train_data_ = std::make_unique<TokenDataset>(train_files_, train_options);
  if (!val_files_.empty()) {
    TokenDatasetOptions val_options = train_options;
    val_options.shuffle = false;
    val_options.prefetch = false;  // rank and world_size as for training: each rank its own rows
    val_data_ = std::make_unique<TokenDataset>(val_files_, val_options);
    val_start_ = val_data_->position();
  }
}

void Trainer::setup_model() {
  model_ = std::make_unique<models::GPT2>(config_.model, config_.seed);
  std::optional<DType> param_dtype;
  if (policy_.param_dtype != DType::f32) param_dtype = policy_.param_dtype;
  flat_ = nn::flatten_parameters(*model_, device_, param_dtype);
  if (group_) {
    // Before the optimizer copies them (master weights): every rank starts from rank 0's parameters.
    distributed::broadcast_parameters(*flat_, *group_);
    const DistributedConfig& dist = config_.distributed;
    distributed::ReducerOptions options;
    options.bucket_sizes.first_bytes = static_cast<int64_t>(dist.first_bucket_mb * (1 << 20));
    options.bucket_sizes.bytes = static_cast<int64_t>(dist.bucket_mb * (1 << 20));
    options.reduce_dtype = policy_.grad_reduce_dtype;
    options.profiler = &profiler_;
    reducer_ = std::make_unique<distributed::Reducer>(flat_, group_, options);
  }
  const OptimizerConfig& o = config_.optimizer;
  auto groups = optim::default_param_groups(*model_, o.weight_decay);
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
  schedule_ = optim::LrSchedule{config_.schedule.kind, o.lr, config_.schedule.min_lr, config_.schedule.warmup_steps,
                                config_.schedule.decay_steps};
}

void Trainer::setup_step() {
  loss_sum_ = zeros({}, DType::f64, device_);
  grad_norm_ = zeros({2}, DType::f64, device_);
}

namespace {

// `host` (a CPU batch) into the device buffer `dst` through pinned memory: the copy is queued
// on the compute stream and the host moves on (the pinned allocator holds the staging buffer
// until the copy has run).
void stage(const Tensor& dst, const Tensor& host) {
  Tensor pinned = empty_pinned(host.shape(), host.dtype());
  copy_(pinned, host);
  copy_(dst, pinned);
}

}  // namespace

void Trainer::stage_batches(std::vector<Tensor>& inputs, std::vector<Tensor>& targets) {
  for (size_t micro = 0; micro < static_cast<size_t>(config_.batch.grad_accum); ++micro) {
    TokenBatch batch = train_data_->next_batch();
    if (!device_.is_cuda()) {
      inputs.push_back(batch.inputs);
      targets.push_back(batch.targets);
      continue;
    }
    // Fixed buffers, made once: a captured step reads its batches from these addresses.
    if (device_inputs_.size() == micro) {
      device_inputs_.push_back(empty(batch.inputs.shape(), batch.inputs.dtype(), device_));
      device_targets_.push_back(empty(batch.targets.shape(), batch.targets.dtype(), device_));
    }
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
  if (world_size_ > 1)
    return "data parallelism over " + std::to_string(world_size_) +
           " ranks: the gradient all-reduces are launched from the backward's hooks and waited for on the host, "
           "which a captured step cannot do yet";
  if (config_.model.dropout > 0)
    return "dropout draws its random offset on the host every step (model.dropout is " +
           std::to_string(config_.model.dropout) + "; 0 allows the graph)";
  return "";
}

namespace {

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
  flat_->zero_grad_lazily();     // each first gradient is written, not added to zeros
  ops::autocast::clear_cache();  // the weights changed in the last step
  if (policy_.autocasts()) {
    // This step's weight casts, one kernel per flat buffer instead of one per weight.
    for (const nn::FlatBuffer& b : flat_->buffers()) {
      if (!is_floating(b.dtype)) continue;
      std::vector<Tensor> leaves;
      for (const nn::FlatSlot& s : b.slots) leaves.push_back(s.param);
      ops::autocast::precache(b.data, leaves, policy_.compute_dtype);
    }
  }
  const int64_t accum = config_.batch.grad_accum;
  fill_(loss_sum_, 0.0);
  // The gradient each micro-batch's loss receives: 1/accum of the step's mean, times the loss
  // scale (read from device memory on the GPU). The fused classifier makes the logits'
  // gradient with it in the loss's own pass; otherwise the backward starts from the loss.
  const Tensor loss_gradient = config_.fused_classifier
                                   ? scaler_->scale(full({}, 1.0 / static_cast<double>(accum), DType::f32, device_))
                                   : Tensor();
  for (int64_t micro = 0; micro < accum; ++micro) {
    if (reporting_ && micro == 0) start_numerics();
    models::GPT2Output out;
    Tensor loss;
    {
      MaybePhase phase(profiler, "forward");
      ops::autocast::Scope autocast(policy_.compute_dtype, policy_.autocasts());
      out = model_->forward(inputs[micro], targets[micro], loss_gradient);
      loss = out.loss;
      // The sum stays on the device (f64): no read-back per micro-batch.
      accumulate_(loss_sum_, loss);
    }
    nn::set_activation_observer(nullptr);
    {
      MaybePhase phase(profiler, "backward");
      // Only the last micro-step's backward reduces: the gradients summed over the micro-steps.
      std::optional<distributed::NoSync> no_sync;
      if (reducer_ && micro + 1 < accum) no_sync.emplace(*reducer_);
      if (out.fused_classifier()) {
        out.backward();
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
    for (const Tensor& p : model_->parameters()) params_before.push_back(p.detach().clone());
  }
  finish_step(profiler);
  if (reporting_) finish_numerics(params_before);
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
    optim::clip_grad_norm(model_->parameters(), config_.optimizer.grad_clip, scaler_->scale_tensor(), found_inf,
                          grad_norm_);
    optimizer_->step({.grad_factor = grad_norm_.select(0, 1), .skip_if = found_inf});
  }
  // Without loss scaling the update only counts a skipped non-finite step (train/nonfinite.h).
  MaybePhase phase(scaler_->enabled() ? profiler : nullptr, "scaler");
  scaler_->update();
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
  auto named = model_->named_parameters();
  for (size_t i = 0; i < named.size(); ++i)
    numerics_.record_update(amp::layer_of(named[i].name), params_before[i], named[i].tensor, named[i].tensor.grad());
  std::cout << numerics_.table(step_ + 1, scaler_->scale());
  if (!numerics_out_.is_open())
    numerics_out_.open((fs::path(config_.out_dir) / "numerics.jsonl").string(), /*append=*/true);
  for (const Json& row : numerics_.json(step_ + 1, scaler_->scale())) numerics_out_.write(row);
}

int64_t Trainer::peak_memory_bytes() const { return static_cast<int64_t>(allocator_for(device_).stats().peak_bytes); }

double Trainer::evaluate() {
  if (!val_data_) return std::nan("");
  NoGradGuard no_grad;
  model_->eval();
  // The same batches every time, so the curve shows the model, not the sampling noise.
  val_data_->restore(val_start_);
  double total = 0;
  for (int64_t i = 0; i < config_.eval_steps; ++i) {
    TokenBatch batch = val_data_->next_batch();
    total += model_->forward(batch.inputs.to(device_), batch.targets.to(device_)).loss.item();
  }
  model_->train();
  // Each rank saw its own rows of the validation batches: their mean is the global batch's.
  return mean_over_ranks({total / static_cast<double>(std::max<int64_t>(config_.eval_steps, 1))})[0];
}

std::string Trainer::sample(const std::string& prompt, int64_t tokens) {
  std::vector<int32_t> ids = tokenizer_->encode(prompt);
  if (ids.empty()) ids.push_back(tokenizer_->eot_token() >= 0 ? tokenizer_->eot_token() : 0);
  std::vector<int32_t> out =
      model_->generate(ids, tokens, config_.sample.temperature, config_.sample.top_k, config_.seed);
  return tokenizer_->decode(out);
}

Json Trainer::train_state() const {
  Json state = Json::object();
  state["step"] = step_;
  state["data"] = train_data_->position().to_json();
  Json rng = Json::object();
  rng["dropout_seed"] = static_cast<int64_t>(model_->dropout_generator().seed());
  rng["dropout_offset"] = static_cast<int64_t>(model_->dropout_generator().offset());
  state["rng"] = rng;
  state["model"] = model_->config().to_json();
  state["tokenizer"] = tokenizer_json_;
  state["scaler"] = scaler_->state();
  state["precision"] = policy_.describe();
  state["optimizer"] = config_.optimizer.name;
  state["param_dtype"] = dtype_name(policy_.param_dtype);
  state["master_weights"] = policy_.master_weights;
  state["config_path"] = config_.config_path;
  return state;
}

void Trainer::check_nonfinite() { enforce_nonfinite_rule(config_, step_, scaler_->consecutive_overflows()); }

void Trainer::save_checkpoint() {
  check_nonfinite();       // every rank: the same gradients, so the same count and the same decision
  if (!is_main()) return;  // every rank holds the same parameters and optimizer state
  train::save_checkpoint(config_.checkpoint.dir, step_, *model_, optimizer_.get(), train_state(),
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
  Json state = load_checkpoint(config_.checkpoint.dir, *model_, optimizer_.get());
  step_ = state.at("step").as_int();
  // The position is in global windows: a run resumed under another world size (or per-rank
  // batch) continues the same stream of windows, split over its own ranks from there on.
  train_data_->restore(TokenDatasetPosition::from_json(state.at("data")));
  const Json& rng = state.at("rng");
  model_->dropout_generator().manual_seed(static_cast<uint64_t>(rng.at("dropout_seed").as_int()));
  model_->dropout_generator().set_offset(static_cast<uint64_t>(rng.at("dropout_offset").as_int()));
  if (state.contains("scaler")) scaler_->load_state(state.at("scaler"));
  if (is_main()) std::cout << "resumed from " << config_.checkpoint.dir << " at step " << step_ << "\n";
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
  // Every rank's tokens; TFLOP/s and MFU below are per device.
  double tokens_per_step =
      static_cast<double>(config_.batch.micro_batch * config_.batch.seq_len * config_.batch.grad_accum * world_size_);
  r.tokens_per_s = tokens_per_step * steps / std::max(interval_seconds, 1e-9);
  for (auto& [name, ms] : profiler_.take_ms()) r.phase_ms.emplace_back(name, ms / steps);
  // Training FLOPs: 3x the forward (backward is twice the forward).
  r.tflops = 3.0 * model_->config().flops_per_token_forward(config_.batch.seq_len) * r.tokens_per_s /
             static_cast<double>(world_size_) / 1e12;
  if (device_.is_cuda()) {
    double peak = device_peak_tflops(device_, policy_.compute_dtype, policy_.allow_tf32);
    if (peak > 0) r.mfu = *r.tflops / peak;
  }
  r.val_loss = val_loss;
  if (scaler_->enabled()) r.loss_scale = scaler_->scale();
  r.skipped_steps = scaler_->skipped_steps();
  r.peak_memory_bytes = peak_memory_bytes();
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
  const auto& c = model_->config();
  if (is_main() && group_)
    std::cout << "data parallel: " << world_size_ << " ranks (" << group_->backend_name() << "), rank 0 on " << device_
              << "; the batch below is per rank; " << reducer_->buckets().size() << " gradient buckets, reduced in "
              << dtype_name(policy_.grad_reduce_dtype) << "\n";
  if (is_main())
    std::cout << "precis: GPT-2 " << c.n_layer << " layers, " << c.n_head << " heads, " << c.n_embd << " wide, vocab "
              << c.vocab_size << " (" << model_->num_parameters_unpadded() / 1e6 << "M parameters) on " << device_
              << "; " << config_.batch.micro_batch << " x " << config_.batch.seq_len << " tokens x "
              << config_.batch.grad_accum << " micro-steps per step; " << train_data_->num_tokens()
              << " training tokens\n"
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
  while (step_ < config_.max_steps) {
    reporting_ = report_due() && is_main();  // the report is printed and written by rank 0
    bool tracing = step_trace_ && step_ + 1 == config_.profile.trace_step;
    if (tracing) step_trace_->begin(profiler_);
    train_step();
    if (tracing) step_trace_->end(profiler_, step_ + 1, std::cout);
    ++step_;
    ++interval_steps;
    bool eval_now =
        val_data_ && config_.eval_interval > 0 && (step_ % config_.eval_interval == 0 || step_ == config_.max_steps);
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
  if (!val_data_) final_val_loss_ = std::nan("");
  check_nonfinite();
  if (config_.checkpoint.save_final) save_checkpoint();
  if (config_.sample.tokens > 0 && is_main()) {
    std::cout << "---- sample (" << config_.sample.tokens << " tokens, temperature " << config_.sample.temperature
              << ", top_k " << config_.sample.top_k << ") ----\n"
              << sample(config_.sample.prompt, config_.sample.tokens) << "\n----\n";
  }
}

}  // namespace precis::train
