// GPT2Tokenizer: OpenAI's GPT-2 byte-level BPE (gpt-2/src/encoder.py), reading
// the released encoder.json and vocab.bpe. Gives the same ids as tiktoken's
// "gpt2" encoding (scripts/gpt2_reference.py checks the test cases against it).
#pragma once

#include <array>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/source_dir.h"
#include "data/tokenizer.h"

namespace precis {

// assets/gpt2 of the source tree, which holds encoder.json and vocab.bpe.
inline constexpr const char* kGpt2AssetsDir = PRECIS_SOURCE_DIR "/assets/gpt2";

class GPT2Tokenizer : public Tokenizer {
 public:
  // Reads `directory`/encoder.json and `directory`/vocab.bpe.
  explicit GPT2Tokenizer(const std::string& directory = kGpt2AssetsDir);
  GPT2Tokenizer(const std::string& encoder_json_path, const std::string& vocab_bpe_path);

  // Text to ids, with "<|endoftext|>" in the text becoming the end-of-text token
  // (tiktoken's encode(text, allowed_special={"<|endoftext|>"}), as llm.c's data scripts use).
  std::vector<int32_t> encode(std::string_view text) const override;
  // Text to ids with "<|endoftext|>" encoded as ordinary text (tiktoken's encode_ordinary).
  std::vector<int32_t> encode_ordinary(std::string_view text) const;
  std::string decode(const std::vector<int32_t>& ids) const override;
  // The bytes of one token; a token may hold part of a UTF-8 character.
  const std::string& token_bytes(int32_t id) const;
  int32_t vocab_size() const override { return static_cast<int32_t>(token_bytes_.size()); }
  int32_t eot_token() const override { return eot_token_; }

 private:
  struct Merge {
    int32_t rank;    // lower merges first
    int32_t result;  // the id of the merged token
  };
  static uint64_t pair_key(int32_t left, int32_t right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
  }

  void encode_piece(std::string_view piece, std::vector<int32_t>& out) const;
  std::vector<int32_t> byte_pair_merge(std::string_view piece) const;

  std::vector<std::string> token_bytes_;        // id -> bytes
  std::array<int32_t, 256> byte_token_{};       // byte -> the id of its one-byte token
  std::unordered_map<uint64_t, Merge> merges_;  // (left id, right id) -> merge
  int32_t eot_token_ = -1;

  // Pieces repeat (" the", "\n"), so their ids are cached, as encoder.py does.
  // encode() is const and may run on several threads, hence the mutex.
  mutable std::mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache_;
};

}  // namespace precis
