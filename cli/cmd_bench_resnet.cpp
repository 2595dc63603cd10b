// precis bench resnet: ResNet training throughput on synthetic images (one fixed batch,
// copied to the device once, so the figures are the model's), through the same Trainer
// as `precis train` with `task: image_classification` (no validation, no checkpoint).
// 32x32 images use the CIFAR stem and 10 classes, larger ones the ImageNet stem and 1000
// classes; SGD with momentum, as ResNets are trained. Warm-up steps are left out of the
// figures; the last line is one machine-readable record (key=value pairs). --profile profiles
// the measured steps op by op, as `precis profile` does (docs/profiling.md).
#include <algorithm>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "cli/bench_common.h"
#include "cli/commands.h"
#include "cli/usage.h"
#include "core/error.h"
#include "core/gpu.h"
#include "core/op_profile.h"
#include "ops/conv.h"
#include "train/config.h"
#include "train/image_task.h"
#include "train/trainer.h"

namespace precis::cli {

namespace {

struct ResnetBenchOptions {
  std::string model = "resnet18";
  int64_t batch = 256, image = 32, steps = 30, warmup = 5;
  std::string precision = "bf16", device = "auto";
  std::string out_dir = (std::filesystem::temp_directory_path() / "precis-bench-resnet").string();
  bool channels_last = false, cuda_graphs = false;
  bool profile = false;               // the measured steps profiled op by op (and kernel by kernel on a GPU)
  std::vector<std::string> settings;  // KEY=VALUE config overrides, applied after the bench's own
};

ResnetBenchOptions parse_resnet_options(const Args& args) {
  Args rest;
  ResnetBenchOptions b;
  for (const std::string& a : args) {
    if (a == "--channels-last") {
      b.channels_last = true;
    } else if (a == "--cuda-graphs") {
      b.cuda_graphs = true;
    } else if (a == "--profile") {
      b.profile = true;
    } else {
      rest.push_back(a);
    }
  }
  Options o =
      parse_options(rest, {"model", "batch", "image", "precision", "steps", "warmup", "device", "out"}, "bench resnet");
  for (const std::string& p : o.positional) {
    usage_check(p.find('=') != std::string::npos, "bench resnet", "unexpected argument '" + p + "'");
    b.settings.push_back(p);
  }
  b.model = o.get("model", b.model);
  PRECIS_CHECK(b.model.starts_with("resnet") &&
                   std::count(models::image_model_names().begin(), models::image_model_names().end(), b.model),
               "bench: unknown --model '", b.model, "' (known: resnet18, resnet34, resnet50)");
  b.batch = parse_count(o, "batch", b.batch, 1);
  b.image = parse_count(o, "image", b.image, 8);
  b.steps = parse_count(o, "steps", b.steps, 1);
  b.warmup = parse_count(o, "warmup", b.warmup, 0);
  b.precision = o.get("precision", b.precision);
  b.device = o.get("device", b.device);
  b.out_dir = o.get("out", b.out_dir);
  return b;
}

train::TrainConfig resnet_bench_config(const ResnetBenchOptions& b) {
  const bool cifar = b.image <= 32;
  std::vector<std::string> overrides = {
      "task=image_classification",
      "model.name=" + b.model,
      std::string("model.cifar_stem=") + (cifar ? "true" : "false"),
      "data.dataset=synthetic",
      "data.image_size=" + std::to_string(b.image),
      "data.channels=3",
      "data.num_classes=" + std::string(cifar ? "10" : "1000"),
      "batch.micro_batch=" + std::to_string(b.batch),
      "precision=" + b.precision,
      std::string("channels_last=") + (b.channels_last ? "true" : "false"),
      "cuda_graphs=" + std::string(b.cuda_graphs ? "true" : "false"),
      "device=" + b.device,
      "out_dir=" + b.out_dir,
      "optimizer.name=sgd",
      "optimizer.lr=0.1",
      "optimizer.momentum=0.9",
      "optimizer.weight_decay=5e-4",
      "optimizer.grad_clip=0",
      "schedule.kind=constant",
      "eval_interval=0",
      "checkpoint.save_final=false",
      "max_steps=" + std::to_string(b.warmup + b.steps),
      "log_interval=" + std::to_string(b.warmup > 0 ? b.warmup : b.steps),
  };
  overrides.insert(overrides.end(), b.settings.begin(), b.settings.end());
  try {
    return train::parse_config("", overrides, "bench");
  } catch (const Error& e) {
    PRECIS_FAIL("bench: ", e.what());
  }
}

void print_resnet_figures(const ResnetBenchOptions& b, train::Trainer& trainer, const train::SteadyState& s) {
  Device device = resolve_device(trainer.config().device, /*quiet=*/true);
  const int ranks = trainer.world_size();
  const int64_t accum = trainer.config().batch.grad_accum;
  const double images_per_s = static_cast<double>(b.batch * accum * ranks) * 1000.0 / s.ms_per_step;
  const double peak_gib = static_cast<double>(trainer.peak_memory_bytes()) / (1ull << 30);
  const bool channels_last = dynamic_cast<train::ImageTask&>(trainer.task()).channels_last();
  std::string device_text = device.str();
  if (device.is_cuda()) device_text.append(" ").append(cuda_device_name(device.index));
  std::cout << "\n==== precis bench resnet ====\n"
            << "model        " << trainer.task().describe() << "\n"
            << "run          " << device_text << ", " << trainer.policy().describe() << ", B=" << b.batch << ", "
            << b.image << "x" << b.image << " synthetic images"
            << (accum > 1 ? " x " + std::to_string(accum) + " micro-steps" : "")
            << (ranks > 1 ? " per rank, " + std::to_string(ranks) + " ranks" : "")
            << (b.cuda_graphs ? ", CUDA graphs" : "") << "\n"
            << "measured     " << s.steps << " steps after " << b.warmup << " warm-up step(s)\n"
            << "images/s     " << format("%.0f", images_per_s) << "\n"
            << "ms/step      " << format("%.2f", s.ms_per_step) << "\n";
  print_phases(s);
  const double measured_gib = static_cast<double>(s.peak_memory_bytes) / (1ull << 30);
  std::cout << "peak memory  " << format("%.3f", peak_gib) << " GiB; " << format("%.3f", measured_gib)
            << " GiB over the measured steps (as PyTorch's max_memory_allocated after a reset, with what a captured "
               "graph keeps)\n"
            << "metrics      " << trainer.config().out_dir << "/metrics.jsonl\n";
  std::string record =
      "result: bench=resnet model=" + b.model + " device=" + device.str() + " precision=" + b.precision +
      " channels_last=" + (channels_last ? "true" : "false") + " cuda_graphs=" + (b.cuda_graphs ? "true" : "false") +
      " ranks=" + std::to_string(ranks) + " batch=" + std::to_string(b.batch) + " image=" + std::to_string(b.image) +
      " steps=" + std::to_string(s.steps) + " warmup=" + std::to_string(b.warmup) +
      " images_per_s=" + format("%.0f", images_per_s) + " ms_per_step=" + format("%.3f", s.ms_per_step) +
      " peak_gib=" + format("%.3f", peak_gib) + " measured_peak_gib=" + format("%.3f", measured_gib);
  if (device.is_cuda())  // which cuDNN API ran the convolutions (PRECIS_CUDNN_CONV)
    record += std::string(" cudnn_conv=") + (ops::cudnn_conv_api() == ops::CudnnConvApi::graph ? "graph" : "legacy");
  for (const auto& [name, ms] : s.phase_ms) record += " " + name + "_ms=" + format("%.3f", ms);
  std::cout << record << std::endl;
}

}  // namespace

int bench_resnet_command(const Args& args) {
  ResnetBenchOptions b = parse_resnet_options(args);
  train::TrainConfig config = resnet_bench_config(b);
  if (!resolve_device(config.device, /*quiet=*/true).is_cuda())
    std::cerr << "note: bench resnet on the CPU is slow; --batch 8 --image 32 --steps 2 is sized for a CPU\n";
  train::Trainer trainer(config);
  OpProfile profile(resolve_device(config.device, /*quiet=*/true), /*trace_kernels=*/true);
  if (b.profile) trainer.profile_ops(&profile, b.warmup + 1);
  trainer.run();
  train::SteadyState s = train::steady_state(trainer.reports(), b.warmup);
  PRECIS_CHECK(s.steps == b.steps, "bench: measured ", s.steps, " steps instead of ", b.steps,
               " (the log intervals did not line up with the warm-up)");
  if (trainer.rank() == 0) print_resnet_figures(b, trainer, s);
  if (trainer.rank() == 0 && b.profile) print_bench_profile(trainer, profile);
  return 0;
}

}  // namespace precis::cli
