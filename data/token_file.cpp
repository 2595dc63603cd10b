#include "data/token_file.h"

#include <fcntl.h>
#include <glob.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <utility>

#include "core/error.h"

namespace precis {

// The format is little-endian and read by plain loads.
static_assert(std::endian::native == std::endian::little, "token files need a little-endian host");

void write_token_file(const std::string& path, std::span<const int32_t> tokens) {
  std::vector<uint16_t> narrow(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    PRECIS_CHECK(tokens[i] >= 0 && tokens[i] <= 65535, "write_token_file: token ", tokens[i], " at index ", i,
                 " does not fit in the uint16 of a token file (", path,
                 "); version 1 holds vocabularies of up to 65536 tokens");
    narrow[i] = static_cast<uint16_t>(tokens[i]);
  }
  int32_t header[256] = {};
  header[0] = kTokenFileMagic;
  header[1] = kTokenFileVersion;
  // llm.c keeps the count in an int32.
  PRECIS_CHECK(tokens.size() <= static_cast<size_t>(INT32_MAX), "write_token_file: ", tokens.size(),
               " tokens are more than the int32 count of a token-file header allows; split them into shards");
  header[2] = static_cast<int32_t>(tokens.size());

  std::string temporary = path + ".tmp";
  {
    std::ofstream file(temporary, std::ios::binary | std::ios::trunc);
    PRECIS_CHECK(file, "write_token_file: cannot create ", temporary,
                 ": check that the directory exists and is writable");
    file.write(reinterpret_cast<const char*>(header), sizeof(header));
    file.write(reinterpret_cast<const char*>(narrow.data()), static_cast<std::streamsize>(narrow.size() * 2));
    file.close();
    PRECIS_CHECK(file, "write_token_file: writing ", temporary, " failed (disk full?)");
  }
  std::error_code error;
  std::filesystem::rename(temporary, path, error);
  PRECIS_CHECK(!error, "write_token_file: cannot rename ", temporary, " to ", path, ": ", error.message());
}

int64_t validate_token_file(const std::string& path) {
  std::error_code error;
  PRECIS_CHECK(std::filesystem::is_regular_file(path, error), "token file ", path,
               " does not exist or is not a file; check the path, or make it with `precis tokenize`");
  const int64_t file_bytes = static_cast<int64_t>(std::filesystem::file_size(path, error));
  PRECIS_CHECK(!error, "token file ", path, ": cannot read its size: ", error.message());
  PRECIS_CHECK(file_bytes >= kTokenFileHeaderBytes, "token file ", path, " is ", file_bytes,
               " bytes, shorter than the ", kTokenFileHeaderBytes,
               "-byte header; it is truncated or not a token file. Make it again with `precis tokenize`");

  int32_t header[256];
  std::ifstream file(path, std::ios::binary);
  PRECIS_CHECK(file.read(reinterpret_cast<char*>(header), sizeof(header)), "token file ", path,
               ": cannot read its header; check the file's permissions");
  PRECIS_CHECK(header[0] == kTokenFileMagic, "token file ", path, " starts with ", header[0], " instead of the magic ",
               kTokenFileMagic, "; it is not an llm.c token file. Make it with `precis tokenize`");
  PRECIS_CHECK(header[1] == kTokenFileVersion, "token file ", path, " has version ", header[1],
               "; Precis reads version ", kTokenFileVersion,
               " (uint16 tokens, as llm.c writes for GPT-2), not llm.c's version 2 (uint32 tokens). ",
               "Make the file with `precis tokenize`");
  const int64_t count = header[2];
  PRECIS_CHECK(count >= 0, "token file ", path, " has a negative token count ", count,
               " in its header; the file is damaged. Make it again with `precis tokenize`");
  const int64_t expected_bytes = kTokenFileHeaderBytes + 2 * count;
  PRECIS_CHECK(file_bytes >= expected_bytes, "token file ", path, " is truncated: its header promises ", count,
               " tokens (", expected_bytes, " bytes) but the file has ", file_bytes,
               " bytes. The write was probably interrupted; make it again with `precis tokenize`");
  PRECIS_CHECK(file_bytes == expected_bytes, "token file ", path, " has ", file_bytes - expected_bytes,
               " bytes after the ", count, " tokens its header counts; the header does not match the data. ",
               "Make the file again with `precis tokenize`");
  return count;
}

std::vector<int32_t> read_token_file(const std::string& path) {
  TokenFileView view(path);
  return std::vector<int32_t>(view.tokens(), view.tokens() + view.size());
}

TokenFileView::TokenFileView(const std::string& path) : path_(path), num_tokens_(validate_token_file(path)) {
  mapping_bytes_ = static_cast<size_t>(kTokenFileHeaderBytes + 2 * num_tokens_);
  int fd = ::open(path.c_str(), O_RDONLY);
  PRECIS_CHECK(fd >= 0, "token file ", path, ": cannot open it: ", std::strerror(errno));
  void* mapping = ::mmap(nullptr, mapping_bytes_, PROT_READ, MAP_SHARED, fd, 0);
  int saved_errno = errno;
  ::close(fd);  // the mapping keeps the file open
  PRECIS_CHECK(mapping != MAP_FAILED, "token file ", path, ": cannot memory-map it: ", std::strerror(saved_errno));
  mapping_ = mapping;
  tokens_ = reinterpret_cast<const uint16_t*>(static_cast<const char*>(mapping_) + kTokenFileHeaderBytes);
}

TokenFileView::~TokenFileView() {
  if (mapping_) ::munmap(mapping_, mapping_bytes_);
}

TokenFileView::TokenFileView(TokenFileView&& other) noexcept
    : path_(std::move(other.path_)),
      mapping_(std::exchange(other.mapping_, nullptr)),
      mapping_bytes_(other.mapping_bytes_),
      tokens_(other.tokens_),
      num_tokens_(other.num_tokens_) {}

void check_token_ids(const TokenFileView& view, int64_t vocab_size) {
  const uint16_t* tokens = view.tokens();
  const int64_t n = view.size();
  // The largest token first (a vectorisable pass); the position only when one is out of range.
  uint16_t largest = 0;
  for (int64_t i = 0; i < n; ++i) largest = std::max(largest, tokens[i]);
  if (largest < vocab_size) return;
  int64_t i = 0;
  while (tokens[i] < vocab_size) ++i;
  PRECIS_FAIL("token file ", view.path(), ": token ", tokens[i], " at byte offset ", kTokenFileHeaderBytes + 2 * i,
              " (token ", i, ") is outside the model's vocabulary of ", vocab_size,
              " tokens; the shard was made with another tokenizer or is damaged. Make it again with `precis "
              "tokenize` and the tokenizer of this run");
}

std::vector<std::string> find_token_files(const std::string& pattern) {
  glob_t matches{};
  int status = ::glob(pattern.c_str(), 0, nullptr, &matches);
  std::vector<std::string> files;
  if (status == 0)
    for (size_t i = 0; i < matches.gl_pathc; ++i) files.emplace_back(matches.gl_pathv[i]);
  ::globfree(&matches);
  PRECIS_CHECK(!files.empty(), "no token files match ", pattern,
               "; check the path, or make them with `precis tokenize`");
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace precis
