#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "core/source_dir.h"
#include "data/char_tokenizer.h"
#include "support/errors.h"

using namespace precis;
using precis::testing::error_of;

namespace {

std::string read_file(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  std::ostringstream contents;
  contents << file.rdbuf();
  return contents.str();
}

}  // namespace

TEST(CharTokenizer, VocabularyIsTheSortedDistinctBytes) {
  CharTokenizer tok = CharTokenizer::from_text("hello world");
  EXPECT_EQ(tok.chars(), " dehlorw");
  EXPECT_EQ(tok.vocab_size(), 8);
  EXPECT_EQ(tok.eot_token(), -1);
  EXPECT_EQ(tok.encode("hello"), (std::vector<int32_t>{3, 2, 4, 4, 5}));
  EXPECT_EQ(tok.decode({7, 5, 6, 4, 1}), "world");
}

TEST(CharTokenizer, TinyShakespeareAsNanoGptSeesIt) {
  std::string text = read_file(PRECIS_SOURCE_DIR "/assets/tinyshakespeare.txt");
  CharTokenizer tok = CharTokenizer::from_text(text);
  // nanoGPT's data/shakespeare_char/prepare.py: 65 characters, "\n !$&',-.3:;?ABC...xyz".
  EXPECT_EQ(tok.vocab_size(), 65);
  EXPECT_EQ(tok.chars(), "\n !$&',-.3:;?ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz");
  std::vector<int32_t> ids = tok.encode(text);
  EXPECT_EQ(ids.size(), text.size());
  // "First Citizen:" in nanoGPT's stoi.
  EXPECT_EQ(std::vector<int32_t>(ids.begin(), ids.begin() + 6), (std::vector<int32_t>{18, 47, 56, 57, 58, 1}));
  EXPECT_EQ(tok.decode(ids), text);
}

TEST(CharTokenizer, NonAsciiBytesWork) {
  std::string text = "na\xC3\xAFve \xFF";
  CharTokenizer tok = CharTokenizer::from_text(text);
  EXPECT_EQ(tok.chars().back(), '\xFF');
  EXPECT_EQ(tok.decode(tok.encode(text)), text);
}

TEST(CharTokenizer, SaveAndLoadKeepTheIds) {
  auto path = std::filesystem::temp_directory_path() / "precis_test_char_vocab.json";
  CharTokenizer tok = CharTokenizer::from_text("ba\n\"\\\xE9");
  tok.save(path.string());
  EXPECT_EQ(read_file(path.string()), "{\"tokenizer\":\"char\",\"vocab_size\":6,\"bytes\":[10,34,92,97,98,233]}\n");
  CharTokenizer back = CharTokenizer::load(path.string());
  EXPECT_EQ(back.chars(), tok.chars());
  EXPECT_EQ(back.encode("ab\n"), tok.encode("ab\n"));
  std::filesystem::remove(path);
}

TEST(CharTokenizer, ClearErrors) {
  CharTokenizer tok = CharTokenizer::from_text("abc");
  EXPECT_NE(error_of([&] { tok.encode("abz"); }).find("'z' at byte 2 of the text is not in the vocabulary of 3"),
            std::string::npos);
  EXPECT_NE(error_of([&] { tok.encode("\x01"); }).find("byte 0x01 at byte 0"), std::string::npos);
  EXPECT_NE(error_of([&] {
              tok.decode({0, 3});
            }).find("token id 3 is outside the vocabulary [0, 3)"),
            std::string::npos);
  EXPECT_NE(error_of([] { CharTokenizer(""); }).find("vocabulary is empty"), std::string::npos);
  EXPECT_NE(error_of([] { CharTokenizer("aba"); }).find("'a' appears twice"), std::string::npos);
  EXPECT_NE(error_of([] {
              CharTokenizer::from_json(Json::parse(R"({"tokenizer":"gpt2"})"), "v.json");
            }).find("v.json is not a char vocabulary"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              CharTokenizer::from_json(Json::parse(R"({"tokenizer":"char","bytes":[97,300]})"), "v.json");
            }).find("v.json: \"bytes\" must hold integers 0..255, found 300"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              CharTokenizer::from_json(Json::parse(R"({"tokenizer":"char","vocab_size":3,"bytes":[97]})"), "v.json");
            }).find("says vocab_size 3 but lists 1 bytes"),
            std::string::npos);
  EXPECT_NE(error_of([] { CharTokenizer::load("/nonexistent/vocab.json"); }).find("/nonexistent/vocab.json"),
            std::string::npos);
}
