// The subcommands of the `precis` command line, one file each.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace precis::cli {

using Args = std::vector<std::string>;

int train_command(const Args& args);     // precis train CONFIG [key=value ...]
int sample_command(const Args& args);    // precis sample CHECKPOINT [--prompt TEXT] [--tokens N] ...
int tokenize_command(const Args& args);  // precis tokenize --tokenizer gpt2|char INPUT OUT_PREFIX [--val-fraction F]
int device_command(const Args& args);    // precis device
int numerics_command(const Args& args);  // precis numerics CONFIG [key=value ...]
int sweep_command(const Args& args);     // precis sweep CONFIG [--precisions a,b,c] [key=value ...]
int profile_command(const Args& args);   // precis profile CONFIG [key=value ...] [--steps N] [--warmup W]
int bench_command(const Args& args);     // precis bench gpt2 [--preset P] [--batch B] [--seq T] ...
int bench_attention_command(const Args& args);  // precis bench attention [--tokens N] [--seq 512,1024,...] ...
int bench_resnet_command(const Args& args);     // precis bench resnet [--model resnet18|resnet50] [--batch B] ...
int eval_command(const Args& args);             // precis eval CHECKPOINT_OR_RUN_DIR [--data PATH] [--steps N] ...
int plot_command(const Args& args);             // precis plot RUN_DIR [RUN_DIR ...] [--out FILE.svg] [--csv FILE.csv]
int formats_command(const Args& args);          // precis formats [VALUE ...] [--out DIR]
int bench_matmul_command(const Args& args);     // precis bench matmul [--shapes ...] [--dtypes ...] [--out DIR]
int version_command();                          // precis --version

// "--name value" options after the positional arguments; unknown options are usage errors (cli/usage.h).
struct Options {
  std::string command;  // for messages: "sample"
  std::vector<std::string> positional;
  std::vector<std::pair<std::string, std::string>> named;
  std::string get(const std::string& name, const std::string& fallback) const;
  // The option as a whole number or a finite number in [min, max] (the whole text must be the
  // value: "1e9" is not an integer), else `fallback`; errors name the command, option and text
  // (an integer's max of INT64_MAX is "no upper bound").
  int64_t integer(const std::string& name, int64_t fallback, int64_t min, int64_t max) const;
  uint64_t unsigned_integer(const std::string& name, uint64_t fallback) const;
  double number(const std::string& name, double fallback, double min, double max) const;
};
Options parse_options(const Args& args, const std::vector<std::string>& known, const std::string& command);

}  // namespace precis::cli
