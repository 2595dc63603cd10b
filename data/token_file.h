// Token files in llm.c's shard format, so shards made by llm.c's data scripts
// (dev/data/*.py) and by `precis tokenize` are interchangeable:
//   a header of 256 little-endian int32: [0] magic 20240520, [1] version 1,
//   [2] the token count; then the tokens as uint16.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace precis {

inline constexpr int32_t kTokenFileMagic = 20240520;
inline constexpr int32_t kTokenFileVersion = 1;
inline constexpr int64_t kTokenFileHeaderBytes = 256 * sizeof(int32_t);

// Writes `tokens` (each in [0, 65535]) to `path`, through a temporary file renamed
// into place, so a reader never sees half a shard.
void write_token_file(const std::string& path, std::span<const int32_t> tokens);

// Checks the header against the file's size and returns the token count. Every
// problem (missing file, wrong magic or version, truncation) is a precis::Error
// naming the file and what to do.
int64_t validate_token_file(const std::string& path);

// All tokens of a file.
std::vector<int32_t> read_token_file(const std::string& path);

// A read-only memory map of a validated token file: the OS pages tokens in as
// they are used, so shards larger than memory work.
class TokenFileView {
 public:
  explicit TokenFileView(const std::string& path);
  ~TokenFileView();
  TokenFileView(TokenFileView&& other) noexcept;
  TokenFileView(const TokenFileView&) = delete;
  TokenFileView& operator=(const TokenFileView&) = delete;
  TokenFileView& operator=(TokenFileView&&) = delete;

  const uint16_t* tokens() const { return tokens_; }
  int64_t size() const { return num_tokens_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  void* mapping_ = nullptr;
  size_t mapping_bytes_ = 0;
  const uint16_t* tokens_ = nullptr;
  int64_t num_tokens_ = 0;
};

// Checks that every token of `view` is below `vocab_size` (one pass over the mapped file);
// a precis::Error names the file, the first bad token and its byte offset otherwise.
void check_token_ids(const TokenFileView& view, int64_t vocab_size);

// The token files a path or glob pattern ("data/fineweb_train_*.bin") names, sorted;
// an error if there are none.
std::vector<std::string> find_token_files(const std::string& pattern);

}  // namespace precis
