#include "data/tokenize.h"

#include <filesystem>
#include <fstream>
#include <iostream>
#include <span>
#include <sstream>

#include "core/error.h"
#include "data/char_tokenizer.h"
#include "data/gpt2_tokenizer.h"
#include "data/token_file.h"

namespace precis {

namespace {

std::string read_text(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  PRECIS_CHECK(file, "tokenize: cannot open the text file ", path, "; check the path");
  std::ostringstream contents;
  contents << file.rdbuf();
  return contents.str();
}

}  // namespace

TokenizeResult tokenize_file(const std::string& input_path, const std::string& out_prefix, const std::string& tokenizer,
                             double val_fraction, bool quiet) {
  PRECIS_CHECK(tokenizer == "gpt2" || tokenizer == "char", "tokenize: unknown tokenizer \"", tokenizer,
               "\"; use gpt2 or char");
  PRECIS_CHECK(val_fraction >= 0.0 && val_fraction < 1.0, "tokenize: val_fraction must be in [0, 1), got ",
               val_fraction);
  PRECIS_CHECK(!out_prefix.empty(), "tokenize: the output prefix is empty; give one such as data/shakespeare");
  std::string text = read_text(input_path);
  PRECIS_CHECK(!text.empty(), "tokenize: ", input_path, " is empty; there is nothing to train on");

  TokenizeResult result;
  result.train_path = out_prefix + "_train.bin";
  result.val_path = out_prefix + "_val.bin";
  std::filesystem::path directory = std::filesystem::path(out_prefix).parent_path();
  if (!directory.empty()) std::filesystem::create_directories(directory);

  std::vector<int32_t> tokens;
  if (tokenizer == "gpt2") {
    GPT2Tokenizer gpt2;
    tokens = gpt2.encode(text);
    result.vocab_size = gpt2.vocab_size();
  } else {
    CharTokenizer chars = CharTokenizer::from_text(text);
    tokens = chars.encode(text);
    result.vocab_size = chars.vocab_size();
    result.vocab_path = out_prefix + "_vocab.json";
    chars.save(result.vocab_path);
  }

  // As nanoGPT: int(n * 0.9) tokens for training, the rest for validation.
  const int64_t n = static_cast<int64_t>(tokens.size());
  result.train_tokens = static_cast<int64_t>(static_cast<double>(n) * (1.0 - val_fraction));
  result.val_tokens = n - result.train_tokens;
  std::span<const int32_t> all(tokens);
  write_token_file(result.train_path, all.first(result.train_tokens));
  write_token_file(result.val_path, all.subspan(result.train_tokens));

  std::ostringstream summary;
  summary << "tokenize: " << input_path << " (" << text.size() << " bytes, " << tokenizer << ", vocab "
          << result.vocab_size << ") -> " << result.train_tokens << " tokens in " << result.train_path << ", "
          << result.val_tokens << " in " << result.val_path;
  if (!result.vocab_path.empty()) summary << ", vocabulary in " << result.vocab_path;
  result.summary = summary.str();
  if (!quiet) std::cout << result.summary << std::endl;
  return result;
}

}  // namespace precis
