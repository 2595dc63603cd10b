// The `precis` command line: one subcommand per job.
#include <iostream>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "core/error.h"
#include "train/exit_codes.h"

namespace {

void print_usage() {
  std::cout << "usage: precis <command> [args]\n"
               "commands:\n"
               "  train CONFIG.yaml [key=value ...]   train a GPT-2 or an image classifier (LeNet-5, ResNet) from a\n"
               "                                      YAML config (docs/config.md);\n"
               "                                      key=value overrides a setting, e.g. optimizer.lr=1e-3\n"
               "  sample CHECKPOINT [--prompt TEXT] [--tokens N] [--temperature T] [--top-k K] [--seed S]\n"
               "                                      generate text from a checkpoint directory\n"
               "  tokenize --tokenizer gpt2|char INPUT.txt OUT_PREFIX [--val-fraction F]\n"
               "                                      write llm.c token shards OUT_PREFIX_{train,val}.bin\n"
               "  numerics CONFIG.yaml [key=value ...] a short run with the numerics report (per-layer\n"
               "                                      max|x|, zeros, fp16 underflow, inf/nan, lost updates)\n"
               "  sweep CONFIG.yaml [--precisions fp32,tf32,fp16,bf16] [key=value ...]\n"
               "                                      train once per precision policy; table + loss plots\n"
               "  profile CONFIG.yaml [key=value ...] [--steps 3] [--warmup 2]\n"
               "                                      time every op of a few steps: per-op table (FLOPs, bytes,\n"
               "                                      roofline), Amdahl table, OUT_DIR/roofline.svg\n"
               "  bench gpt2 [--preset gpt2|gpt2-medium|gpt2-large|gpt2-xl|tiny] [--batch 16] [--seq 1024]\n"
               "             [--precision bf16] [--steps 30] [--warmup 5] [--attention reference|flash]\n"
               "             [--cuda-graphs] [--trace PATH.json] [--device auto|cuda|cpu] [--zero 0|1]\n"
               "             [--out DIR] [--profile]\n"
               "                                      training throughput: tokens/s, ms/step, phase breakdown,\n"
               "                                      TFLOP/s, MFU, peak memory (warm-up steps left out);\n"
               "                                      --trace writes a Perfetto trace of one step's kernels;\n"
               "                                      under mpirun, --zero 1 shards the optimizer state\n"
               "  bench resnet [--model resnet18|resnet34|resnet50] [--batch 256] [--image 32|224]\n"
               "               [--precision bf16] [--channels-last] [--steps 30] [--warmup 5] [--cuda-graphs]\n"
               "               [--device auto|cuda|cpu] [--out DIR]\n"
               "                                      ResNet training throughput on synthetic images: images/s,\n"
               "                                      phase breakdown, peak memory (32x32: the CIFAR stem)\n"
               "  bench attention [--tokens 16384] [--heads 12] [--head-dim 64] [--seq 512,1024,...]\n"
               "                  [--dtype bf16] [--iters 20] [--impl flash|reference|both]\n"
               "                                      flash vs reference attention alone, by sequence length\n"
               "  device                              show which device `device: auto` would use\n"
               "  help                                this message\n";
}

int run(const std::vector<std::string>& args) {
  using namespace precis::cli;
  if (args.empty() || args[0] == "help" || args[0] == "--help" || args[0] == "-h") {
    print_usage();
    return args.empty() ? 1 : 0;
  }
  const std::string& command = args[0];
  Args rest(args.begin() + 1, args.end());
  if (command == "train") return train_command(rest);
  if (command == "sample") return sample_command(rest);
  if (command == "tokenize") return tokenize_command(rest);
  if (command == "device") return device_command(rest);
  if (command == "numerics") return numerics_command(rest);
  if (command == "sweep") return sweep_command(rest);
  if (command == "bench") return bench_command(rest);
  if (command == "profile") return profile_command(rest);
  PRECIS_FAIL("unknown command '", command, "'; run `precis help` for the list");
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(std::vector<std::string>(argv + 1, argv + argc));
  } catch (const precis::train::StoppedRun& e) {
    std::cerr << "error: " << e.what() << "\n";
    return e.exit_code();
  } catch (const precis::Error& e) {
    std::cerr << "error: " << e.what() << "\n";
    return precis::train::kExitError;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return precis::train::kExitInternal;
  }
}
