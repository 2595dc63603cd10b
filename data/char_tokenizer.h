// CharTokenizer: one token per byte, the vocabulary being the sorted set of
// bytes that occur in a training text (nanoGPT's shakespeare_char: 65 tokens
// for tinyshakespeare). Saved as JSON so that sampling decodes with the ids
// training used.
#pragma once

#include <array>
#include <string>

#include "core/json.h"
#include "data/tokenizer.h"

namespace precis {

class CharTokenizer : public Tokenizer {
 public:
  // `chars[i]` is the byte of id i; each byte at most once.
  explicit CharTokenizer(std::string chars);
  // The vocabulary of `text`: its distinct bytes in increasing order.
  static CharTokenizer from_text(std::string_view text);

  // A byte outside the vocabulary is an error naming it and its position.
  std::vector<int32_t> encode(std::string_view text) const override;
  std::string decode(const std::vector<int32_t>& ids) const override;
  int32_t vocab_size() const override { return static_cast<int32_t>(chars_.size()); }
  int32_t eot_token() const override { return -1; }
  const std::string& chars() const { return chars_; }

  // {"tokenizer": "char", "vocab_size": N, "bytes": [10, 32, ...]}: bytes as numbers, so a
  // vocabulary of non-ASCII bytes is still valid JSON.
  Json to_json() const;
  static CharTokenizer from_json(const Json& json, const std::string& source = "the vocabulary");
  void save(const std::string& path) const;
  static CharTokenizer load(const std::string& path);

 private:
  std::string chars_;
  std::array<int32_t, 256> id_of_byte_;  // -1 for bytes outside the vocabulary
};

}  // namespace precis
