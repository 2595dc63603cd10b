#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "data/token_file.h"
#include "support/errors.h"

using namespace precis;
using precis::testing::error_of;
namespace fs = std::filesystem;

namespace {

class TokenFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("precis_test_token_file_" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  // Writes a raw file: a header with the given fields, then `token_bytes` bytes.
  std::string write_raw(const std::string& name, int32_t magic, int32_t version, int32_t count, size_t token_bytes) {
    std::vector<int32_t> header(256, 0);
    header[0] = magic;
    header[1] = version;
    header[2] = count;
    std::ofstream file(path(name), std::ios::binary);
    file.write(reinterpret_cast<const char*>(header.data()), 1024);
    std::string tokens(token_bytes, '\0');
    file.write(tokens.data(), static_cast<std::streamsize>(tokens.size()));
    return path(name);
  }

  fs::path dir_;
};

}  // namespace

TEST_F(TokenFileTest, RoundTripInLlmcLayout) {
  std::vector<int32_t> tokens = {50256, 0, 1, 65535, 15496, 995};
  write_token_file(path("a.bin"), tokens);
  EXPECT_FALSE(fs::exists(path("a.bin.tmp")));
  EXPECT_EQ(read_token_file(path("a.bin")), tokens);
  EXPECT_EQ(validate_token_file(path("a.bin")), 6);

  // Byte layout: 256 int32 header (magic, version, count), then uint16 tokens, as llm.c's write_datafile.
  ASSERT_EQ(fs::file_size(path("a.bin")), 1024u + 2 * tokens.size());
  std::ifstream file(path("a.bin"), std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  int32_t header[3];
  std::memcpy(header, bytes.data(), sizeof(header));
  EXPECT_EQ(header[0], 20240520);
  EXPECT_EQ(header[1], 1);
  EXPECT_EQ(header[2], 6);
  uint16_t first;
  std::memcpy(&first, bytes.data() + 1024, 2);
  EXPECT_EQ(first, 50256);

  TokenFileView view(path("a.bin"));
  EXPECT_EQ(view.size(), 6);
  EXPECT_EQ(view.tokens()[3], 65535);
  TokenFileView moved(std::move(view));
  EXPECT_EQ(moved.tokens()[4], 15496);
}

TEST_F(TokenFileTest, EmptyFileIsValid) {
  write_token_file(path("empty.bin"), std::vector<int32_t>{});
  EXPECT_TRUE(read_token_file(path("empty.bin")).empty());
}

TEST_F(TokenFileTest, TokensOutsideUint16AreRejected) {
  std::string message = error_of([&] { write_token_file(path("big.bin"), std::vector<int32_t>{1, 65536}); });
  EXPECT_NE(message.find("token 65536 at index 1 does not fit in the uint16"), std::string::npos) << message;
  EXPECT_NE(error_of([&] { write_token_file(path("neg.bin"), std::vector<int32_t>{-1}); }).find("token -1"),
            std::string::npos);
  EXPECT_FALSE(fs::exists(path("big.bin")));
}

TEST_F(TokenFileTest, MissingFileNamesThePath) {
  std::string missing = path("missing.bin");
  std::string message = error_of([&] { read_token_file(missing); });
  EXPECT_NE(message.find("token file " + missing + " does not exist"), std::string::npos) << message;
  EXPECT_NE(message.find("precis tokenize"), std::string::npos);
}

TEST_F(TokenFileTest, WrongMagic) {
  std::string file = write_raw("magic.bin", 12345, 1, 2, 4);
  std::string message = error_of([&] { read_token_file(file); });
  EXPECT_NE(message.find(file + " starts with 12345 instead of the magic 20240520"), std::string::npos) << message;
}

TEST_F(TokenFileTest, WrongVersion) {
  std::string file = write_raw("version.bin", 20240520, 2, 2, 8);
  std::string message = error_of([&] { read_token_file(file); });
  EXPECT_NE(message.find(file + " has version 2; Precis reads version 1"), std::string::npos) << message;
}

TEST_F(TokenFileTest, ShorterThanTheHeader) {
  { std::ofstream(path("short.bin"), std::ios::binary) << "tiny"; }
  std::string message = error_of([&] { read_token_file(path("short.bin")); });
  EXPECT_NE(message.find(path("short.bin") + " is 4 bytes, shorter than the 1024-byte header"), std::string::npos)
      << message;
}

TEST_F(TokenFileTest, TruncatedTokens) {
  std::string file = write_raw("truncated.bin", 20240520, 1, 10, 7);
  std::string message = error_of([&] { read_token_file(file); });
  EXPECT_NE(
      message.find(file + " is truncated: its header promises 10 tokens (1044 bytes) but the file has 1031 bytes"),
      std::string::npos)
      << message;
}

TEST_F(TokenFileTest, CountDoesNotMatchFileSize) {
  std::string file = write_raw("extra.bin", 20240520, 1, 3, 10);
  std::string message = error_of([&] { read_token_file(file); });
  EXPECT_NE(message.find(file + " has 4 bytes after the 3 tokens its header counts"), std::string::npos) << message;
  std::string negative = write_raw("negative.bin", 20240520, 1, -5, 0);
  EXPECT_NE(error_of([&] { read_token_file(negative); }).find("negative token count -5"), std::string::npos);
}

TEST_F(TokenFileTest, FindTokenFilesExpandsGlobsInOrder) {
  write_token_file(path("train_002.bin"), std::vector<int32_t>{1});
  write_token_file(path("train_001.bin"), std::vector<int32_t>{2});
  write_token_file(path("val_001.bin"), std::vector<int32_t>{3});
  EXPECT_EQ(find_token_files(path("train_*.bin")),
            (std::vector<std::string>{path("train_001.bin"), path("train_002.bin")}));
  EXPECT_EQ(find_token_files(path("val_001.bin")), std::vector<std::string>{path("val_001.bin")});
  std::string message = error_of([&] { find_token_files(path("test_*.bin")); });
  EXPECT_NE(message.find("no token files match " + path("test_*.bin")), std::string::npos) << message;
}

// A shard of a larger vocabulary (or a damaged one) fails when it is opened, naming the file,
// the token and its byte offset, instead of deep inside an embedding lookup mid-run.
TEST_F(TokenFileTest, OutOfVocabularyTokensAreFoundWhenOpened) {
  const std::string file = path("big_vocab.bin");
  write_token_file(file, std::vector<int32_t>{1, 64, 3, 50000, 70, 2});
  TokenFileView view(file);
  check_token_ids(view, 50001);  // all in range
  const std::string message = precis::testing::error_of([&] { check_token_ids(view, 65); });
  EXPECT_NE(message.find(file), std::string::npos) << message;
  EXPECT_NE(message.find("token 50000 at byte offset 1030 (token 3)"), std::string::npos) << message;
  EXPECT_NE(message.find("vocabulary of 65 tokens"), std::string::npos) << message;
}
