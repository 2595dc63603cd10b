#include <iostream>

#include "cli/commands.h"
#include "cli/usage.h"
#include "core/error.h"
#include "data/tokenize.h"

namespace precis::cli {

int tokenize_command(const Args& args) {
  Options o = parse_options(args, {"tokenizer", "val-fraction"}, "tokenize");
  usage_check(o.positional.size() == 2, "tokenize", "give an input text file and an output prefix");
  std::string kind = o.get("tokenizer", "gpt2");
  double val_fraction = o.number("val-fraction", 0.1, 0.0, 1.0);
  tokenize_file(o.positional[0], o.positional[1], kind, val_fraction);
  return 0;
}

}  // namespace precis::cli
