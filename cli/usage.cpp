#include "cli/usage.h"

#include <vector>

namespace precis::cli {

namespace {

struct CommandUsage {
  const char* name;      // "bench resnet"
  const char* synopsis;  // the arguments after the name
  const char* summary;   // what it does, indented under the synopsis
};

// In the order `precis help` lists them.
const std::vector<CommandUsage>& usages() {
  static const std::vector<CommandUsage> table = {
      {"train", "CONFIG.yaml [--synthetic] [key=value ...]",
       "train a GPT-2 or an image classifier (LeNet-5, ResNet) from a YAML config (docs/config.md);\n"
       "key=value overrides a setting, e.g. optimizer.lr=1e-3; --synthetic trains an image classifier\n"
       "on synthetic images (data.dataset=synthetic): its model and step without the dataset's files"},
      {"eval",
       "CHECKPOINT_OR_RUN_DIR [--data SHARD_OR_TEXT] [--steps N] [--batch B] [--seq T] [--precision P]\n"
       "     [--device auto|cpu|cuda]",
       "loss and perplexity of a GPT-2 checkpoint, no training: on the run's validation data, or on\n"
       "--data (a token shard .bin or a text file, tokenised with the checkpoint's tokenizer)"},
      {"sample",
       "CHECKPOINT [--prompt TEXT] [--tokens N] [--temperature T] [--top-k K] [--seed S]\n"
       "       [--device auto|cpu|cuda]",
       "generate text from a checkpoint directory (or a Hugging Face GPT-2 folder)"},
      {"plot", "RUN_DIR [RUN_DIR ...] [--out FILE.svg] [--csv FILE.csv] [--numerics FILE.svg]",
       "loss, val loss, lr, grad norm, loss scale, skipped steps and throughput of runs (their\n"
       "metrics.jsonl) as SVG panels, one line per run, and a CSV export (default: metrics.svg\n"
       "and metrics.csv in the first RUN_DIR); --numerics: the runs' numerics reports (fp16\n"
       "underflow of gradients, lost updates) over the steps"},
      {"tokenize", "--tokenizer gpt2|char INPUT.txt OUT_PREFIX [--val-fraction F]",
       "write llm.c token shards OUT_PREFIX_{train,val}.bin"},
      {"numerics", "CONFIG.yaml [key=value ...]",
       "a short run with the numerics report (per-layer max|x|, zeros, fp16 underflow, inf/nan,\n"
       "lost updates)"},
      {"sweep", "CONFIG.yaml [--precisions fp32,tf32,fp16,bf16] [--policy POLICY ...] [key=value ...]",
       "train once per precision policy; table + plots. --precisions lists presets; a custom\n"
       "policy string with commas (params=float32,compute=bfloat16,output=float32) goes in its\n"
       "own --policy, or in --precisions separated by ';'"},
      {"profile", "CONFIG.yaml [key=value ...] [--steps 3] [--warmup 2]",
       "time every op of a few steps: per-op table (FLOPs, bytes, roofline), Amdahl table,\n"
       "OUT_DIR/roofline.svg (docs/profiling.md)"},
      {"bench gpt2",
       "[--preset gpt2|gpt2-medium|gpt2-large|gpt2-xl|tiny] [--batch 16] [--seq 1024]\n"
       "           [--precision bf16] [--steps 30] [--warmup 5] [--attention reference|flash]\n"
       "           [--cuda-graphs] [--trace PATH.json] [--device auto|cuda|cpu] [--zero 0|1]\n"
       "           [--out DIR] [--profile] [KEY=VALUE ...]",
       "training throughput: tokens/s, ms/step, phase breakdown, TFLOP/s, MFU, peak memory\n"
       "(warm-up steps left out); --trace writes a Perfetto trace of one step's kernels;\n"
       "--profile times every op (docs/profiling.md); under mpirun, --zero 1 shards the\n"
       "optimizer state; KEY=VALUE sets config keys (e.g. distributed.bucket_mb=50)"},
      {"bench resnet",
       "[--model resnet18|resnet34|resnet50] [--batch 256] [--image 32|224]\n"
       "             [--precision bf16] [--channels-last] [--steps 30] [--warmup 5] [--cuda-graphs]\n"
       "             [--device auto|cuda|cpu] [--out DIR] [--profile]",
       "ResNet training throughput on synthetic images: images/s, phase breakdown, peak memory\n"
       "(32x32: the CIFAR stem); --profile times every op, and on a GPU every kernel\n"
       "(docs/profiling.md)"},
      {"bench attention",
       "[--tokens 16384 | --batch 1,2,...] [--heads 12] [--head-dim 64] [--seq 512,1024,...]\n"
       "                [--dtype bf16] [--iters 20] [--impl flash|reference|both] [--device cuda|cpu]\n"
       "                [--out DIR]",
       "flash vs reference attention alone, by sequence length (B = tokens / T, or each listed B):\n"
       "time, TFLOP/s, peak memory; --out DIR adds the log-log slopes over T (or B) and plots\n"
       "(docs/labs/04-attention.md)"},
      {"bench matmul",
       "[--shapes tiny,unaligned,aligned,gpt2-b1,gpt2-b64 or MxNxK,...]\n"
       "             [--dtypes fp32,tf32,fp16,bf16] [--iters 10] [--device auto|cuda|cpu] [--out DIR]",
       "matrix products alone: TFLOP/s, % of the dtype's peak, arithmetic intensity, each placed\n"
       "on the device's roofline (DIR/matmul.md, DIR/roofline.svg; docs/labs/03-tensor-cores.md)"},
      {"formats", "[VALUE ...] [--out DIR]",
       "each value's bits, rounding error, class and neighbours in fp32, tf32, fp16, bf16, fp8\n"
       "e4m3 and e5m2 (DIR/formats.md, DIR/formats.svg; docs/labs/01-formats.md)"},
      {"device", "", "show which device `device: auto` would use"},
      {"help", "", "this message; `precis <command> --help` shows one command"},
  };
  return table;
}

std::string indent(const std::string& text, const std::string& prefix) {
  std::string out = prefix;
  for (char c : text) {
    out += c;
    if (c == '\n') out += prefix;
  }
  return out;
}

}  // namespace

std::string command_usage(const std::string& command) {
  const std::string name = command == "bench" ? "bench gpt2" : command;
  for (const CommandUsage& u : usages())
    if (name == u.name)
      return "usage: precis " + name + (*u.synopsis ? " " : "") + u.synopsis + "\n" + indent(u.summary, "  ") + "\n";
  return "";
}

std::string overview_usage() {
  std::string out =
      "usage: precis <command> [args]    (precis <command> --help: that command; precis --version)\n"
      "commands:\n";
  for (const CommandUsage& u : usages())
    out +=
        "  " + std::string(u.name) + (*u.synopsis ? " " : "") + u.synopsis + "\n" + indent(u.summary, "      ") + "\n";
  return out;
}

void usage_fail(const std::string& command, const std::string& problem) {
  throw UsageError(command + ": " + problem + "\n" + command_usage(command));
}

}  // namespace precis::cli
