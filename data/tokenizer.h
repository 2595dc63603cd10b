// Tokenizer: text to token ids and back. GPT2Tokenizer (byte-level BPE) and
// CharTokenizer (one id per byte, as nanoGPT's shakespeare_char) implement it.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace precis {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual std::vector<int32_t> encode(std::string_view text) const = 0;
  // The bytes the ids stand for; an id outside [0, vocab_size()) is an error.
  virtual std::string decode(const std::vector<int32_t>& ids) const = 0;
  virtual int32_t vocab_size() const = 0;
  // The id that separates documents, or -1 where the tokenizer has none.
  virtual int32_t eot_token() const = 0;
};

}  // namespace precis
