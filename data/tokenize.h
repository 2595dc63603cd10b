// tokenize_file: the logic of `precis tokenize`, which turns a text file into
// llm.c token shards for training, as nanoGPT's data/*/prepare.py scripts do.
#pragma once

#include <cstdint>
#include <string>

namespace precis {

struct TokenizeResult {
  std::string train_path;  // OUT_PREFIX_train.bin
  std::string val_path;    // OUT_PREFIX_val.bin
  std::string vocab_path;  // OUT_PREFIX_vocab.json for "char"; empty for "gpt2"
  int64_t train_tokens = 0;
  int64_t val_tokens = 0;
  int32_t vocab_size = 0;
  std::string summary;  // the one-line report, without a newline
};

// Tokenises the whole of `input_path` with `tokenizer` ("gpt2": GPT-2 BPE from assets/gpt2, with
// "<|endoftext|>" in the text read as the end-of-text token; "char": one id per distinct byte)
// and splits the tokens: the first (1 - val_fraction) go to OUT_PREFIX_train.bin, the rest to
// OUT_PREFIX_val.bin. The char vocabulary goes to OUT_PREFIX_vocab.json. Creates the prefix's
// directory if needed and prints the summary line to stdout unless `quiet`.
TokenizeResult tokenize_file(const std::string& input_path, const std::string& out_prefix, const std::string& tokenizer,
                             double val_fraction, bool quiet = false);

}  // namespace precis
