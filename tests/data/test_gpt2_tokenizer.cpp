#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "core/error.h"
#include "core/source_dir.h"
#include "data/gpt2_pretokenize.h"
#include "data/gpt2_tokenizer.h"
#include "data/unicode_classes.h"
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

// Reading the 1 MB encoder.json once for the whole suite keeps the tests fast.
const GPT2Tokenizer& gpt2() {
  static const GPT2Tokenizer tokenizer;
  return tokenizer;
}

struct Case {
  const char* name;
  std::string text;
  bool allow_special;
  std::vector<int32_t> ids;
};

// Produced by `python3 scripts/gpt2_reference.py`: OpenAI's encoder.py over assets/gpt2,
// each case also checked equal to tiktoken's gpt2 encoding (tiktoken 0.14.0).
const std::vector<Case>& reference_cases() {
  static const std::vector<Case> cases = {
      {"hello_world", "Hello world", false, {15496, 995}},
      {"contractions",
       "I'm sure you'll say it's what we've done, they're here and I'd go. DON'T 'tis' x's",
       false,
       {40,  1101, 1654, 345,  1183, 910, 340,   338, 644, 356, 1053,  1760, 11,   484, 821,
        994, 290,  314,  1549, 467,  13,  23917, 6,   51,  705, 48010, 6,    2124, 338}},
      {"whitespace_runs",
       "a  b   c\n\nd \n e\t\tf   \n   x\r\n\r\ny   ",
       false,
       {64,  220, 275, 220, 220, 269, 198,  198, 67,  220, 198, 304, 197, 197, 69,
        220, 220, 220, 198, 220, 220, 2124, 201, 198, 201, 198, 88,  220, 220, 220}},
      {"leading_and_trailing_spaces",
       "   indented\n\n\n    code()  ",
       false,
       {220, 220, 773, 4714, 628, 198, 220, 220, 220, 2438, 3419, 220, 220}},
      {"numbers_and_punctuation",
       "In 1999, pi=3.14159... costs $100!!! (test) -- ok?! [a]{b}<c> #42 @home",
       false,
       {818,  7358,  11,    31028, 28, 18, 13, 1415, 19707, 986, 3484, 720, 3064, 10185, 357,  9288, 8,
        1377, 12876, 12248, 685,   64, 60, 90, 65,   92,    27,  66,   29,  1303, 3682,  2488, 11195}},
      {"latin_greek_cyrillic",
       "h\xC3\xA9llo w\xC3\xB6rld na\xC3\xAFve caf\xC3\xA9 \xCE\x93\xCE\xB5\xCE\xB9\xCE\xAC \xCF\x83\xCE\xBF\xCF\x85 "
       "\xD0\x9F\xD1\x80\xD0\xB8\xD0\xB2\xD0\xB5\xD1\x82, \xD0\xBC\xD0\xB8\xD1\x80!",
       false,
       {71,    2634, 18798, 266,   30570, 335,   41492, 40304, 7377,  241,   30950, 29945, 138, 105,   18074, 225,
        26517, 139,  227,   12466, 253,   21169, 18849, 38857, 16843, 20375, 11,    12466, 120, 18849, 21169, 0}},
      {"cjk_and_emoji",
       "\xE4\xBD\xA0\xE5\xA5\xBD\xE4\xB8\x96\xE7\x95\x8C "
       "\xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E\xE3\x81\xA7\xE3\x81\x99\xE3\x80\x82 \xF0\x9F\x98\x80\xF0\x9F\x91\x8D ok",
       false,
       {19526, 254,   25001, 121,   10310, 244,   45911, 234, 10545, 245, 98,   17312,
        105,   45739, 252,   30640, 33623, 16764, 30325, 222, 41840, 235, 12876}},
      {"unicode_numbers_and_spaces",
       "\xD9\xA1\xD9\xA2\xD9\xA3 \xC2\xBD x\xC2\xA0y z\xE3\x80\x80w \xE2\x85\xA3 \xC2\xB2",
       false,
       {149, 94, 149, 95, 149, 96, 25208, 2124, 1849, 88, 1976, 5099, 222, 86, 2343, 227, 96, 1587, 110}},
      {"special_token", "Hello<|endoftext|> world<|endoftext|>", true, {15496, 50256, 995, 50256}},
      {"special_token_as_text", "Hello<|endoftext|> world", false, {15496, 27, 91, 437, 1659, 5239, 91, 29, 995}},
  };
  return cases;
}

// FNV-1a over the ids, as scripts/gpt2_reference.py computes it.
uint64_t fnv1a64(const std::vector<int32_t>& ids) {
  uint64_t hash = 0xCBF29CE484222325ull;
  for (int32_t id : ids) {
    hash ^= static_cast<uint64_t>(id);
    hash *= 0x100000001B3ull;
  }
  return hash;
}

std::vector<std::string> pieces_of(std::string_view text) {
  std::vector<std::string> out;
  for (std::string_view piece : gpt2_pretokenize(text)) out.emplace_back(piece);
  return out;
}

}  // namespace

TEST(Gpt2Tokenizer, VocabularyAndEndOfText) {
  EXPECT_EQ(gpt2().vocab_size(), 50257);
  EXPECT_EQ(gpt2().eot_token(), 50256);
  EXPECT_EQ(gpt2().token_bytes(50256), "<|endoftext|>");
  EXPECT_EQ(gpt2().token_bytes(220), " ");   // "Ġ": the space byte spelled U+0120
  EXPECT_EQ(gpt2().token_bytes(198), "\n");  // "Ċ"
  EXPECT_EQ(gpt2().token_bytes(262), " the");
}

TEST(Gpt2Tokenizer, MatchesReferenceEncodings) {
  for (const Case& c : reference_cases()) {
    std::vector<int32_t> ids = c.allow_special ? gpt2().encode(c.text) : gpt2().encode_ordinary(c.text);
    EXPECT_EQ(ids, c.ids) << c.name;
    EXPECT_EQ(gpt2().decode(ids), c.text) << c.name;
  }
}

TEST(Gpt2Tokenizer, EncodeRecognisesEndOfTextButEncodeOrdinaryDoesNot) {
  EXPECT_EQ(gpt2().encode("<|endoftext|>"), std::vector<int32_t>{50256});
  EXPECT_EQ(gpt2().encode("<|endoftext|><|endoftext|>"), (std::vector<int32_t>{50256, 50256}));
  EXPECT_EQ(gpt2().encode_ordinary("<|endoftext|>"), (std::vector<int32_t>{27, 91, 437, 1659, 5239, 91, 29}));
  // A near miss is plain text.
  EXPECT_EQ(gpt2().encode("<|endoftext|"), gpt2().encode_ordinary("<|endoftext|"));
  EXPECT_TRUE(gpt2().encode("").empty());
}

TEST(Gpt2Tokenizer, WholeOfTinyShakespeare) {
  std::string text = read_file(PRECIS_SOURCE_DIR "/assets/tinyshakespeare.txt");
  ASSERT_EQ(text.size(), 1115394u);
  std::vector<int32_t> ids = gpt2().encode(text);
  // 338025 tokens is also the total nanoGPT's data/shakespeare/prepare.py reports (301966 + 36059).
  EXPECT_EQ(ids.size(), 338025u);
  EXPECT_EQ(fnv1a64(ids), 0xB547AD363C19676Eull);  // from scripts/gpt2_reference.py
  EXPECT_EQ(std::vector<int32_t>(ids.begin(), ids.begin() + 8),
            (std::vector<int32_t>{5962, 22307, 25, 198, 8421, 356, 5120, 597}));
  EXPECT_EQ(gpt2().decode(ids), text);
}

TEST(Gpt2Tokenizer, InvalidUtf8StillRoundTrips) {
  // Byte-level BPE encodes any bytes; a stray byte is its own `other` character when splitting.
  std::string text = "ok \xFF\xFE bad \xC3 half \xE4\xB8 cut \xED\xA0\x80 surrogate";
  EXPECT_EQ(gpt2().decode(gpt2().encode(text)), text);
}

TEST(Gpt2Tokenizer, SameIdsFromSeveralThreads) {
  std::string text = read_file(PRECIS_SOURCE_DIR "/assets/tinyshakespeare.txt").substr(0, 50000);
  GPT2Tokenizer fresh;  // an empty cache, so the threads race to fill it
  std::vector<int32_t> expected = gpt2().encode(text);
  std::vector<std::vector<int32_t>> results(4);
  std::vector<std::thread> threads;
  for (auto& result : results) threads.emplace_back([&] { result = fresh.encode(text); });
  for (auto& thread : threads) thread.join();
  for (const auto& result : results) EXPECT_EQ(result, expected);
}

TEST(Gpt2Tokenizer, DecodeRejectsIdsOutsideTheVocabulary) {
  EXPECT_NE(error_of([] {
              gpt2().decode({15496, 50257});
            }).find("token id 50257 is outside the vocabulary [0, 50257)"),
            std::string::npos);
  EXPECT_NE(error_of([] { gpt2().decode({-1}); }).find("token id -1"), std::string::npos);
}

TEST(Gpt2Tokenizer, MissingOrMismatchedFilesAreClearErrors) {
  std::string message = error_of([] { GPT2Tokenizer("/nonexistent/gpt2"); });
  EXPECT_NE(message.find("/nonexistent/gpt2/encoder.json"), std::string::npos) << message;

  auto dir = std::filesystem::temp_directory_path() / "precis_test_gpt2_files";
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "vocab.bpe") << "#version: 0.2\n\xC4\xA0 t\n\xC4\xA0t zzqx\n";
  std::string encoder = PRECIS_SOURCE_DIR "/assets/gpt2/encoder.json";
  message = error_of([&] { GPT2Tokenizer(encoder, (dir / "vocab.bpe").string()); });
  EXPECT_NE(message.find("the merge \"\xC4\xA0t zzqx\" on line 3"), std::string::npos) << message;
  EXPECT_NE(message.find("must come from the same release"), std::string::npos) << message;
  std::filesystem::remove_all(dir);
}

TEST(Gpt2Pretokenize, SplitsAsTheRegexDoes) {
  using Pieces = std::vector<std::string>;
  EXPECT_EQ(pieces_of("Hello world"), (Pieces{"Hello", " world"}));
  // Contractions split off (lower case only, as in GPT-2); a lone quote is punctuation.
  EXPECT_EQ(pieces_of("we'll it's I'D 'x"), (Pieces{"we", "'ll", " it", "'s", " I", "'", "D", " '", "x"}));
  // A whitespace run leaves its last space to the next word; a lone newline stands alone.
  EXPECT_EQ(pieces_of("a   b\nc"), (Pieces{"a", "  ", " b", "\n", "c"}));
  EXPECT_EQ(pieces_of("x \n\n y"), (Pieces{"x", " \n\n", " y"}));
  EXPECT_EQ(pieces_of("end  "), (Pieces{"end", "  "}));
  EXPECT_EQ(pieces_of("\t\tz"), (Pieces{"\t", "\t", "z"}));  // only a space joins the next word
  // Letters, numbers and other characters form separate runs, each taking one leading space.
  EXPECT_EQ(pieces_of("abc123!? 45 x"), (Pieces{"abc", "123", "!?", " 45", " x"}));
  EXPECT_EQ(pieces_of("caf\xC3\xA9 \xE4\xB8\xAD\xE6\x96\x87"), (Pieces{"caf\xC3\xA9", " \xE4\xB8\xAD\xE6\x96\x87"}));
  EXPECT_TRUE(pieces_of("").empty());
}

TEST(UnicodeClasses, LettersNumbersSpaces) {
  EXPECT_EQ(char_class(U'a'), CharClass::letter);
  EXPECT_EQ(char_class(U'Z'), CharClass::letter);
  EXPECT_EQ(char_class(U'7'), CharClass::number);
  EXPECT_EQ(char_class(U' '), CharClass::space);
  EXPECT_EQ(char_class(U'\n'), CharClass::space);
  EXPECT_EQ(char_class(U'_'), CharClass::other);
  EXPECT_EQ(char_class(0x00E9), CharClass::letter);  // é
  EXPECT_EQ(char_class(0x03A9), CharClass::letter);  // Ω
  EXPECT_EQ(char_class(0x0436), CharClass::letter);  // ж
  EXPECT_EQ(char_class(0x4E2D), CharClass::letter);  // 中
  EXPECT_EQ(char_class(0x3042), CharClass::letter);  // あ
  EXPECT_EQ(char_class(0xAC00), CharClass::letter);  // 가
  EXPECT_EQ(char_class(0x0663), CharClass::number);  // Arabic-Indic 3
  EXPECT_EQ(char_class(0x00BD), CharClass::number);  // ½
  EXPECT_EQ(char_class(0x2163), CharClass::number);  // Roman numeral four
  EXPECT_EQ(char_class(0x00A0), CharClass::space);   // no-break space
  EXPECT_EQ(char_class(0x3000), CharClass::space);   // ideographic space
  EXPECT_EQ(char_class(0x3002), CharClass::other);   // 。
  EXPECT_EQ(char_class(0x1F600), CharClass::other);  // 😀
  EXPECT_EQ(char_class(0x0301), CharClass::other);   // combining acute accent is \p{M}, not \p{L}
  EXPECT_EQ(char_class(0x10FFFF), CharClass::other);
}

TEST(UnicodeClasses, DecodeUtf8) {
  auto decode = [](std::string_view text) { return decode_utf8(text, 0); };
  EXPECT_EQ(decode("A").code_point, U'A');
  EXPECT_EQ(decode("\xC3\xA9").code_point, 0xE9u);
  EXPECT_EQ(decode("\xC3\xA9").length, 2u);
  EXPECT_EQ(decode("\xE4\xB8\xAD").code_point, 0x4E2Du);
  EXPECT_EQ(decode("\xF0\x9F\x98\x80").code_point, 0x1F600u);
  EXPECT_EQ(decode("\xF0\x9F\x98\x80").length, 4u);
  // Invalid: a stray continuation byte, an overlong '/', a surrogate, a cut-off sequence, past U+10FFFF.
  for (std::string_view bad : {"\x80", "\xC0\xAF", "\xED\xA0\x80", "\xE4\xB8", "\xF4\x90\x80\x80"}) {
    EXPECT_EQ(decode(bad).code_point, 0xFFFDu) << bad;
    EXPECT_EQ(decode(bad).length, 1u);
  }
  std::string out;
  append_utf8(out, 0x1F600);
  append_utf8(out, 0x120);
  EXPECT_EQ(out, "\xF0\x9F\x98\x80\xC4\xA0");
}
