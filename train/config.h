// The training configuration: what a YAML file (docs/config.md) says, with defaults.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "amp/grad_scaler.h"
#include "amp/precision_policy.h"
#include "models/gpt2_config.h"
#include "models/image_classifier.h"

namespace precis::train {

struct DataConfig {
  std::string text_file;  // tokenised on the fly into out_dir/data, or
  std::string train_bin;  // llm.c token shards (a path or a glob)
  std::string val_bin;
  std::string tokenizer = "char";  // char | gpt2 (for text_file)
  double val_fraction = 0.1;       // last fraction of text_file used for validation
  std::string order = "random";    // random | sequential
  bool prefetch = true;
  // image_classification:
  std::string dataset = "mnist";  // mnist | cifar10 | synthetic
  std::string dir;                // the dataset's files; empty: assets/mnist for mnist
  int64_t crop_padding = 0;       // random crop after padding by this many pixels; 0: none
  bool flip = false;              // random horizontal flip
  int64_t image_size = 32;        // synthetic: square images of this side
  int64_t channels = 3;           // synthetic
  int64_t num_classes = 10;       // synthetic
};

struct OptimizerConfig {
  std::string name = "adamw";  // adamw | sgd
  double lr = 6e-4;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
  double momentum = 0.9;   // sgd
  bool nesterov = false;   // sgd
  double grad_clip = 1.0;  // 0 disables clipping
  // Autocast policies: the step also writes the f16/bf16 weight casts the next forward reads
  // (optim::Optimizer::set_compute_copies), instead of a cast pass at each step's start.
  bool writes_weight_casts = true;
};

struct ScheduleConfig {
  std::string kind = "cosine";  // cosine | constant | linear | wsd | inverse_sqrt (optim/lr_schedule.h)
  int64_t warmup_steps = 0;
  double min_lr = 6e-5;
  int64_t decay_steps = -1;     // -1: max_steps
  double decay_fraction = 0.2;  // wsd: the share of the steps after warmup spent decaying
  // Set when decay_steps came from max_steps: a resumed run then keeps the checkpoint's
  // schedule instead of stretching it to a new max_steps (train/resume_schedule.h).
  bool decay_steps_from_max_steps = false;
};

struct BatchConfig {
  int64_t micro_batch = 12;     // B
  int64_t seq_len = 64;         // T
  int64_t grad_accum = 1;       // micro-steps per optimizer step, or
  int64_t tokens_per_step = 0;  // when > 0: grad_accum = tokens_per_step / (B * T), which must divide
};

struct PrecisionConfig {
  // `policy` (a preset fp32, tf32, fp16, bf16, bf16-pure, or a jmp-style string
  // "params=float32,compute=bfloat16,output=float32"), refined by the keys params, compute,
  // output, master_weights, allow_tf32, loss_scaling; a refined preset's name ends in "*".
  amp::PrecisionPolicy policy;
  // The loss_scale, growth_*, backoff_factor, min/max_scale and hysteresis keys; `enabled`
  // and `mode` follow the policy's loss_scaling (fp32 does not scale).
  amp::GradScalerOptions scaler{.enabled = false};
  bool stochastic_rounding = false;  // bf16 parameters rounded stochastically from the master weights
  bool report = false;               // the numerics report (docs/precision.md)
  int64_t report_interval = 0;       // steps between reports; 0: log_interval
};

struct CheckpointConfig {
  std::string dir;         // empty: out_dir/checkpoints
  int64_t interval = 0;    // steps between checkpoints; 0: only at the end
  int64_t keep_last = 2;   // older checkpoints are deleted
  bool resume = false;     // continue from the latest checkpoint in dir
  bool overwrite = false;  // a new run in a folder with checkpoints deletes them (else an error)
  bool save_final = true;  // write a checkpoint at the end of run() (the benchmark turns it off)
};

struct SampleConfig {
  int64_t tokens = 200;  // 0: no sample at the end
  double temperature = 0.8;
  int64_t top_k = 40;
  std::string prompt = "\n";
};

struct ProfileConfig {
  std::string trace;       // a Chrome/Perfetto trace (JSON) of one step with every GPU kernel; empty: none
  int64_t trace_step = 3;  // the step traced (1-based, as in the log line; after warm-up)
  // Consecutive steps traced from trace_step on: with 2 or more, what runs between two steps
  // while the host runs ahead (the step's first and last steps still wait for the GPU).
  int64_t trace_steps = 1;
};

// distributed.fused_gather: false | true (asked for: an error without ZeRO-1, a note where it
// cannot be) | auto, the default (where it can be, quietly; the all-gather elsewhere).
enum class FusedGather { off, on, where_possible };

// Data parallelism (docs/distributed.md); read only when the launch has more than one rank.
struct DistributedConfig {
  std::string backend = "auto";  // auto (nccl on GPUs, mpi on the CPU) | nccl | mpi
  double bucket_mb = 25;         // gradient bucket size (MiB), after the first
  double first_bucket_mb = 1;    // the first bucket (the last layers' gradients): small, so comm starts early
  double timeout_s = 300;        // the rendezvous' and every collective's wait before a rank fails (the watchdog)
  int64_t zero = 0;              // 0: plain DDP; 1: ZeRO-1, optimizer state sharded (distributed/zero.h)
  bool gather_overlap = false;   // ZeRO-1: the parameters' all-gather runs behind the next forward
  bool reduce_overlap = true;    // each bucket's reduction launched when it is ready (false: after the backward)
  // ZeRO-1: the optimizer stores into every rank's parameters (one NVLink node), no all-gather.
  FusedGather fused_gather = FusedGather::where_possible;
};

struct TrainConfig {
  std::string task = "language_model";  // language_model (GPT-2) | image_classification
  models::GPT2Config model;             // vocab_size: the trainer sets it from the data's tokenizer
  std::string model_preset = "custom";  // model.preset: gpt2 | gpt2-medium | gpt2-large | gpt2-xl | custom
  std::string init_from;                // model.init_from: pretrained weights (train/pretrained.h); empty: none
  // image_classification: model.name and model.cifar_stem; channels and classes come from the data.
  models::ImageModelConfig image_model;
  DataConfig data;
  OptimizerConfig optimizer;
  ScheduleConfig schedule;
  BatchConfig batch;
  PrecisionConfig precision;
  CheckpointConfig checkpoint;
  SampleConfig sample;
  ProfileConfig profile;
  DistributedConfig distributed;
  int64_t max_steps = 100;
  int64_t eval_interval = 50;  // 0: no validation during training
  int64_t eval_steps = 10;     // batches per validation
  int64_t log_interval = 10;
  uint64_t seed = 1337;
  std::string device = "auto";         // auto | cpu | cuda | cuda:N
  int64_t threads = 0;                 // CPU threads, 0: all cores
  bool cuda_graphs = false;            // capture the training step in a CUDA graph after warm-up and replay it
  bool matmul_autotune = true;         // GPU: time cuBLASLt's candidate algorithms once per large product
  bool fused_classifier = true;        // the loss and the logits' gradient in one pass over the logits
  std::string channels_last = "auto";  // image_classification: auto (on for fp16/bf16 on a GPU) | true | false
  // A step whose gradients hold inf or NaN is skipped under every policy; `stop` ends the run
  // with an error once max_nonfinite_steps steps in a row were skipped, `skip` never does.
  std::string on_nonfinite = "stop";  // stop | skip
  int64_t max_nonfinite_steps = 25;   // more than the 24 halvings from the scaler's ceiling 2^24 to 1
  std::string out_dir = "out";
  std::string config_path;  // the file it was loaded from
};

// Reads a YAML config and applies command-line overrides ("optimizer.lr=1e-3").
// Unknown keys, wrong types and out-of-range values raise precis::Error naming
// the key and its line and column in the file (or the override text).
TrainConfig load_config(const std::string& path, const std::vector<std::string>& overrides = {});
// Applies overrides to a YAML document given as text (the same rules; for tests and tools).
TrainConfig parse_config(const std::string& yaml_text, const std::vector<std::string>& overrides = {},
                         const std::string& source_name = "<config>");

// Every key of `config` as YAML (defaults, presets and overrides resolved) that reads back
// into the same config; the trainer saves it as out_dir/resolved_config.yaml.
std::string resolved_config_yaml(const TrainConfig& config);

}  // namespace precis::train
