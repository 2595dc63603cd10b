#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "core/source_dir.h"
#include "data/char_tokenizer.h"
#include "data/gpt2_tokenizer.h"
#include "data/token_file.h"
#include "data/tokenize.h"
#include "support/errors.h"

using namespace precis;
using precis::testing::error_of;
namespace fs = std::filesystem;

namespace {

const std::string kShakespeare = PRECIS_SOURCE_DIR "/assets/tinyshakespeare.txt";

std::string read_file(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  std::ostringstream contents;
  contents << file.rdbuf();
  return contents.str();
}

class TokenizeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("precis_test_tokenize_" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

}  // namespace

TEST_F(TokenizeTest, CharSplitMatchesNanoGptShakespeareChar) {
  std::string prefix = (dir_ / "sub" / "shakespeare_char").string();  // the directory is created
  ::testing::internal::CaptureStdout();
  TokenizeResult result = tokenize_file(kShakespeare, prefix, "char", 0.1);
  std::string printed = ::testing::internal::GetCapturedStdout();
  // nanoGPT's data/shakespeare_char/prepare.py: "train has 1,003,854 tokens", "val has 111,540 tokens".
  EXPECT_EQ(result.train_tokens, 1003854);
  EXPECT_EQ(result.val_tokens, 111540);
  EXPECT_EQ(result.vocab_size, 65);
  EXPECT_EQ(result.vocab_path, prefix + "_vocab.json");

  CharTokenizer vocab = CharTokenizer::load(result.vocab_path);
  std::vector<int32_t> train = read_token_file(prefix + "_train.bin");
  std::vector<int32_t> val = read_token_file(prefix + "_val.bin");
  ASSERT_EQ(static_cast<int64_t>(train.size()), result.train_tokens);
  EXPECT_EQ(vocab.decode(train) + vocab.decode(val), read_file(kShakespeare));

  EXPECT_EQ(result.summary, "tokenize: " + kShakespeare + " (1115394 bytes, char, vocab 65) -> 1003854 tokens in " +
                                prefix + "_train.bin, 111540 in " + prefix + "_val.bin, vocabulary in " + prefix +
                                "_vocab.json");
  EXPECT_EQ(printed, result.summary + "\n");
}

TEST_F(TokenizeTest, Gpt2SplitIsTheLastTenthOfTheTokens) {
  std::string prefix = (dir_ / "shakespeare").string();
  ::testing::internal::CaptureStdout();
  TokenizeResult result = tokenize_file(kShakespeare, prefix, "gpt2", 0.1, /*quiet=*/true);
  EXPECT_EQ(::testing::internal::GetCapturedStdout(), "");
  EXPECT_EQ(result.train_tokens, 304222);  // int(338025 * 0.9)
  EXPECT_EQ(result.val_tokens, 33803);
  EXPECT_EQ(result.vocab_size, 50257);
  EXPECT_TRUE(result.vocab_path.empty());
  EXPECT_FALSE(fs::exists(prefix + "_vocab.json"));
  std::vector<int32_t> train = read_token_file(result.train_path);
  std::vector<int32_t> val = read_token_file(result.val_path);
  EXPECT_EQ(std::vector<int32_t>(train.begin(), train.begin() + 4), (std::vector<int32_t>{5962, 22307, 25, 198}));
  GPT2Tokenizer gpt2;
  std::vector<int32_t> all = train;
  all.insert(all.end(), val.begin(), val.end());
  EXPECT_EQ(all, gpt2.encode(read_file(kShakespeare)));
}

TEST_F(TokenizeTest, ClearErrors) {
  std::string prefix = (dir_ / "x").string();
  EXPECT_NE(error_of([&] {
              tokenize_file(kShakespeare, prefix, "bpe", 0.1);
            }).find("unknown tokenizer \"bpe\"; use gpt2 or char"),
            std::string::npos);
  EXPECT_NE(error_of([&] { tokenize_file(kShakespeare, prefix, "char", 1.0); }).find("val_fraction must be in [0, 1)"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              tokenize_file("/nonexistent/input.txt", prefix, "char", 0.1);
            }).find("cannot open the text file /nonexistent/input.txt"),
            std::string::npos);
  fs::create_directories(dir_);
  std::ofstream(dir_ / "empty.txt").close();
  EXPECT_NE(error_of([&] { tokenize_file((dir_ / "empty.txt").string(), prefix, "char", 0.1); }).find("is empty"),
            std::string::npos);
}
