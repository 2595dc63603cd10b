// precis bench gpt2: GPT-2 training throughput on GPT-2 BPE tokens of the
// shipped tinyshakespeare, through the same Trainer as `precis train` (no
// validation, no sample, no checkpoint). Warm-up steps are left out of the
// figures; the last line is one machine-readable record (key=value pairs).
// Under mpirun (or srun, torchrun-style variables) it is data parallel like
// `precis train`: rank 0 prints the figures, tokens/s of every rank, FLOP/s and MFU per GPU.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <limits>
#include <string>
#include <vector>

#include "cli/bench_common.h"
#include "cli/commands.h"
#include "cli/usage.h"
#include "core/error.h"
#include "core/gpu.h"
#include "core/op_profile.h"
#include "core/source_dir.h"
#include "models/gpt2_config.h"
#include "train/config.h"
#include "train/device_peak.h"
#include "train/steady_state.h"
#include "train/trainer.h"

namespace precis::cli {

namespace {

// The GPT-2 family (models::GPT2Config::preset, set through the config's model.preset) and
// `tiny` (2 layers, 2 heads of 64, 128 wide), which runs in seconds on a CPU.
std::vector<std::string> bench_presets() {
  std::vector<std::string> presets = models::GPT2Config::preset_names();
  presets.push_back("tiny");
  return presets;
}

struct BenchOptions {
  std::string preset = "gpt2";
  int64_t batch = 16, seq = 1024, steps = 30, warmup = 5;
  std::string zero = "0";  // distributed.zero under mpirun: 1 shards the optimizer state (ZeRO-1)
  std::string precision = "bf16", attention, trace, device = "auto";  // attention: empty keeps the config's default
  std::string out_dir = (std::filesystem::temp_directory_path() / "precis-bench").string();
  bool cuda_graphs = false;
  bool profile = false;               // the measured steps profiled op by op (docs/profiling.md)
  std::vector<std::string> settings;  // KEY=VALUE config overrides, applied after the bench's own
};

BenchOptions parse_bench_options(const Args& args) {
  Args rest;
  BenchOptions b;
  for (const std::string& a : args) {
    if (a == "--cuda-graphs") {
      b.cuda_graphs = true;
    } else if (a == "--profile") {
      b.profile = true;
    } else {
      rest.push_back(a);
    }
  }
  Options o = parse_options(
      rest, {"preset", "batch", "seq", "precision", "steps", "warmup", "attention", "trace", "device", "zero", "out"},
      "bench");
  std::string models;
  for (const std::string& p : o.positional) {
    if (p.find('=') != std::string::npos)
      b.settings.push_back(p);
    else
      models += (models.empty() ? "" : " ") + p;
  }
  usage_check(models == "gpt2", "bench",
              "give the model to benchmark, gpt2, resnet or attention (" +
                  (models.empty() ? std::string("none given") : "got '" + models + "'") + ")");
  b.preset = o.get("preset", b.preset);
  const std::vector<std::string> presets = bench_presets();
  if (std::find(presets.begin(), presets.end(), b.preset) == presets.end()) {
    std::string known;
    for (const std::string& p : presets) known += (known.empty() ? "" : ", ") + p;
    PRECIS_FAIL("bench: unknown --preset '", b.preset, "' (known: ", known, ")");
  }
  b.batch = o.integer("batch", b.batch, 1, std::numeric_limits<int64_t>::max());
  b.seq = o.integer("seq", b.seq, 1, std::numeric_limits<int64_t>::max());
  b.steps = o.integer("steps", b.steps, 1, std::numeric_limits<int64_t>::max());
  b.warmup = o.integer("warmup", b.warmup, 0, std::numeric_limits<int64_t>::max());
  b.precision = o.get("precision", b.precision);
  b.attention = o.get("attention", b.attention);
  b.trace = o.get("trace", b.trace);
  b.device = o.get("device", b.device);
  b.zero = o.get("zero", b.zero);
  b.out_dir = o.get("out", b.out_dir);
  return b;
}

// The steps before `first_measured` are warm-up (and the traced step, which
// waits for the GPU twice); logging every `first_measured` steps puts an
// interval boundary exactly there.
int64_t first_measured_step(const BenchOptions& b) { return b.warmup + (b.trace.empty() ? 0 : 1); }

train::TrainConfig bench_config(const BenchOptions& b) {
  std::string yaml = "data: {text_file: \"" PRECIS_SOURCE_DIR "/assets/tinyshakespeare.txt\", tokenizer: gpt2}\n";
  std::vector<std::string> overrides = {
      "batch.micro_batch=" + std::to_string(b.batch),
      "batch.seq_len=" + std::to_string(b.seq),
      "precision=" + b.precision,
      "cuda_graphs=" + std::string(b.cuda_graphs ? "true" : "false"),
      "device=" + b.device,
      "distributed.zero=" + b.zero,
      "out_dir=" + b.out_dir,
      "schedule.kind=constant",
      "eval_interval=0",
      "sample.tokens=0",
      "checkpoint.save_final=false",
      "checkpoint.overwrite=true",  // each benchmark replaces the last one's logs (train/run_folder.h)
  };
  int64_t first_measured = first_measured_step(b);
  overrides.push_back("max_steps=" + std::to_string(first_measured + b.steps));
  overrides.push_back("log_interval=" + std::to_string(first_measured > 0 ? first_measured : b.steps));
  if (!b.attention.empty()) overrides.push_back("model.attention=" + b.attention);
  if (b.preset == "tiny") {
    for (const char* size : {"model.n_layer=2", "model.n_head=2", "model.n_embd=128"}) overrides.push_back(size);
    overrides.push_back("model.block_size=" + std::to_string(b.seq));
  } else {
    overrides.push_back("model.preset=" + b.preset);
    // GPT-2's 1024 positions, raised for longer sequences (the sequence-length scaling runs).
    if (b.seq > 1024) overrides.push_back("model.block_size=" + std::to_string(b.seq));
  }
  if (!b.trace.empty()) {
    overrides.push_back("profile.trace=" + b.trace);
    overrides.push_back("profile.trace_step=" + std::to_string(first_measured));
  }
  overrides.insert(overrides.end(), b.settings.begin(), b.settings.end());
  try {
    return train::parse_config(yaml, overrides, "bench");
  } catch (const Error& e) {
    PRECIS_FAIL("bench: ", e.what());
  }
}

void print_figures(const BenchOptions& b, train::Trainer& trainer, const train::SteadyState& s) {
  const models::GPT2Config& model = trainer.gpt2().config();
  Device device = resolve_device(trainer.config().device, /*quiet=*/true);
  const int ranks = trainer.world_size();
  const double tokens_per_step = static_cast<double>(b.batch * b.seq * trainer.config().batch.grad_accum * ranks);
  const double tokens_per_s = tokens_per_step * 1000.0 / s.ms_per_step;
  // Per GPU; backward = 2x forward.
  const double tflops = 3.0 * model.flops_per_token_forward(b.seq) * tokens_per_s / ranks / 1e12;
  const double peak = train::device_peak_tflops(device, trainer.policy().compute_dtype, trainer.policy().allow_tf32);
  const double peak_gib = static_cast<double>(trainer.peak_memory_bytes()) / (1ull << 30);
  std::string device_text = device.str();
  if (device.is_cuda()) device_text.append(" ").append(cuda_device_name(device.index));

  std::cout << "\n==== precis bench gpt2 ====\n"
            << "model        " << b.preset << ": " << model.n_layer << " layers, " << model.n_head << " heads, "
            << model.n_embd << " wide, " << format("%.1f", trainer.gpt2().num_parameters_unpadded() / 1e6)
            << "M parameters, attention " << model.attention << "\n"
            << "run          " << device_text << ", " << trainer.policy().describe() << ", B=" << b.batch
            << " x T=" << b.seq
            << (trainer.config().batch.grad_accum > 1
                    ? " x " + std::to_string(trainer.config().batch.grad_accum) + " micro-steps"
                    : "")
            << (ranks > 1 ? " per rank, " + std::to_string(ranks) + " ranks" : "")
            << (trainer.config().cuda_graphs ? ", CUDA graphs" : "")
            << (ranks > 1 && trainer.config().distributed.zero == 1 ? ", ZeRO-1" : "") << "\n"
            << "measured     " << s.steps << " steps after " << b.warmup << " warm-up step(s)"
            << (b.trace.empty() ? "" : " and the traced step") << "\n"
            << "tokens/s     " << format("%.0f", tokens_per_s) << "\n"
            << "ms/step      " << format("%.2f", s.ms_per_step) << "\n";
  print_phases(s);
  std::cout << "achieved     " << format(tflops >= 1 ? "%.1f" : "%.3g", tflops) << " TFLOP/s"
            << (ranks > 1 ? " per GPU" : "") << " (6N + attention FLOPs per token)\n"
            << "MFU          "
            << (peak > 0 ? format("%.1f%%", 100.0 * tflops / peak) + " of " + format("%.1f", peak) +
                               " TFLOP/s peak for " + dtype_name(trainer.policy().compute_dtype)
                         : std::string("n/a (no peak figure for the CPU)"))
            << "\n"
            << "peak memory  " << format("%.2f", peak_gib) << " GiB; "
            << format("%.2f", static_cast<double>(s.peak_memory_bytes) / (1ull << 30))
            << " GiB over the measured steps\n"
            << "metrics      " << trainer.config().out_dir << "/metrics.jsonl\n";

  std::string record =
      "result: bench=gpt2 preset=" + b.preset + " device=" + device.str() + " precision=" + trainer.policy().name +
      " attention=" + model.attention + " cuda_graphs=" + (trainer.config().cuda_graphs ? "true" : "false") +
      " ranks=" + std::to_string(ranks) + " zero=" + std::to_string(trainer.config().distributed.zero) +
      " batch=" + std::to_string(b.batch) + " seq=" + std::to_string(b.seq) + " steps=" + std::to_string(s.steps) +
      " warmup=" + std::to_string(b.warmup) + " tokens_per_s=" + format("%.0f", tokens_per_s) +
      " ms_per_step=" + format("%.3f", s.ms_per_step) + " tflops=" + format("%.2f", tflops) +
      " mfu=" + (peak > 0 ? format("%.4f", tflops / peak) : "n/a") + " peak_gib=" + format("%.3f", peak_gib) +
      " peak_bytes=" + std::to_string(trainer.peak_memory_bytes()) +
      " measured_peak_bytes=" + std::to_string(s.peak_memory_bytes) +
      " optimizer_state_bytes=" + std::to_string(trainer.optimizer().state_bytes());
  for (const auto& [name, ms] : s.phase_ms) record += " " + name + "_ms=" + format("%.3f", ms);
  std::cout << record << std::endl;
}

}  // namespace

int bench_command(const Args& args) {
  if (!args.empty() && args[0] == "attention") return bench_attention_command(Args(args.begin() + 1, args.end()));
  if (!args.empty() && args[0] == "resnet") return bench_resnet_command(Args(args.begin() + 1, args.end()));
  if (!args.empty() && args[0] == "matmul") return bench_matmul_command(Args(args.begin() + 1, args.end()));
  BenchOptions b = parse_bench_options(args);
  train::TrainConfig config = bench_config(b);
  if (b.preset != "tiny" && !resolve_device(config.device, /*quiet=*/true).is_cuda())
    std::cerr << "note: bench " << b.preset << " at B=" << b.batch << ", T=" << b.seq
              << " on the CPU is slow and can need tens of GiB; --preset tiny --batch 2 --seq 64 is sized for a CPU\n";
  train::Trainer trainer(config);
  OpProfile profile(resolve_device(config.device, /*quiet=*/true), /*trace_kernels=*/true);
  if (b.profile) trainer.profile_ops(&profile, first_measured_step(b) + 1);
  trainer.run();
  train::SteadyState s = train::steady_state(trainer.reports(), first_measured_step(b));
  PRECIS_CHECK(s.steps == b.steps, "bench: measured ", s.steps, " steps instead of ", b.steps,
               " (the log intervals did not line up with the warm-up)");
  if (trainer.rank() == 0) print_figures(b, trainer, s);
  if (trainer.rank() == 0 && b.profile) print_bench_profile(trainer, profile);
  return 0;
}

}  // namespace precis::cli
