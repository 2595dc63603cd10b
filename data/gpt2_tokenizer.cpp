#include "data/gpt2_tokenizer.h"

#include <fstream>
#include <sstream>

#include "core/error.h"
#include "core/json.h"
#include "data/gpt2_pretokenize.h"
#include "data/unicode_classes.h"

namespace precis {

namespace {

constexpr std::string_view kEndOfText = "<|endoftext|>";
// A corpus with millions of distinct words would otherwise grow the cache without bound.
constexpr size_t kMaxCachedPieces = size_t{1} << 20;

// encoder.py's bytes_to_unicode(): the printable Latin-1 bytes stand for themselves and the
// other 68 (controls, space, ...) for U+0100.. in byte order, so every token is printable text.
std::array<char32_t, 256> byte_to_unicode() {
  std::array<char32_t, 256> table{};
  auto printable = [](int b) { return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF); };
  char32_t next = 256;
  for (int b = 0; b < 256; ++b) table[b] = printable(b) ? static_cast<char32_t>(b) : next++;
  return table;
}

std::string read_text_file(const std::string& path, const char* what) {
  std::ifstream file(path, std::ios::binary);
  PRECIS_CHECK(file, "GPT2Tokenizer: cannot open ", what, " ", path,
               ": check the path (OpenAI's GPT-2 files ship in assets/gpt2 of the Precis source tree)");
  std::ostringstream contents;
  contents << file.rdbuf();
  return contents.str();
}

}  // namespace

GPT2Tokenizer::GPT2Tokenizer(const std::string& directory)
    : GPT2Tokenizer(directory + "/encoder.json", directory + "/vocab.bpe") {}

GPT2Tokenizer::GPT2Tokenizer(const std::string& encoder_json_path, const std::string& vocab_bpe_path) {
  std::array<char32_t, 256> unicode_of_byte = byte_to_unicode();
  std::unordered_map<char32_t, uint8_t> byte_of_unicode;
  for (int b = 0; b < 256; ++b) byte_of_unicode[unicode_of_byte[b]] = static_cast<uint8_t>(b);

  // encoder.json: token text (bytes spelled with the characters above) -> id.
  Json encoder = read_json_file(encoder_json_path);
  PRECIS_CHECK(encoder.is_object(), "GPT2Tokenizer: ", encoder_json_path,
               " must hold one JSON object mapping token strings to ids; is it GPT-2's encoder.json?");
  const size_t vocab = encoder.size();
  token_bytes_.assign(vocab, std::string());
  std::vector<bool> seen(vocab, false);
  std::unordered_map<std::string, int32_t> id_of_text;
  for (const auto& [text, value] : encoder.as_object()) {
    PRECIS_CHECK(value.is_integer(), "GPT2Tokenizer: ", encoder_json_path, ": the id of \"", text,
                 "\" is not an integer; is it GPT-2's encoder.json?");
    int64_t id = value.as_int();
    PRECIS_CHECK(id >= 0 && static_cast<size_t>(id) < vocab && !seen[id], "GPT2Tokenizer: ", encoder_json_path,
                 ": the ids must be 0..", vocab - 1, " each once, but \"", text, "\" has id ", id);
    seen[id] = true;
    for (size_t pos = 0; pos < text.size();) {
      Utf8Char c = decode_utf8(text, pos);
      auto byte = byte_of_unicode.find(c.code_point);
      PRECIS_CHECK(byte != byte_of_unicode.end(), "GPT2Tokenizer: ", encoder_json_path, ": token \"", text,
                   "\" has a character that stands for no byte; is it GPT-2's encoder.json?");
      token_bytes_[id] += static_cast<char>(byte->second);
      pos += c.length;
    }
    id_of_text.emplace(text, static_cast<int32_t>(id));
  }
  for (int b = 0; b < 256; ++b) {
    std::string text;
    append_utf8(text, unicode_of_byte[b]);
    auto it = id_of_text.find(text);
    PRECIS_CHECK(it != id_of_text.end(), "GPT2Tokenizer: ", encoder_json_path, " has no token for the byte ", b,
                 "; is it GPT-2's encoder.json?");
    byte_token_[b] = it->second;
  }
  if (auto it = id_of_text.find(std::string(kEndOfText)); it != id_of_text.end()) eot_token_ = it->second;

  // vocab.bpe: "#version: 0.2", then one merge "left right" per line, highest priority first.
  std::string merges_text = read_text_file(vocab_bpe_path, "the BPE merges file");
  std::istringstream lines(merges_text);
  std::string line;
  int64_t line_number = 0;
  int32_t rank = 0;
  while (std::getline(lines, line)) {
    ++line_number;
    if (line.empty() || (line_number == 1 && line.rfind("#version", 0) == 0)) continue;
    size_t space = line.find(' ');
    PRECIS_CHECK(space != std::string::npos && line.find(' ', space + 1) == std::string::npos,
                 "GPT2Tokenizer: ", vocab_bpe_path, " line ", line_number, " is \"", line,
                 "\", not a merge \"left right\"; is it GPT-2's vocab.bpe?");
    std::string left = line.substr(0, space), right = line.substr(space + 1);
    auto left_id = id_of_text.find(left), right_id = id_of_text.find(right), result = id_of_text.find(left + right);
    PRECIS_CHECK(left_id != id_of_text.end() && right_id != id_of_text.end() && result != id_of_text.end(),
                 "GPT2Tokenizer: the merge \"", line, "\" on line ", line_number, " of ", vocab_bpe_path,
                 " uses a token that ", encoder_json_path, " lacks; the two files must come from the same release");
    merges_.emplace(pair_key(left_id->second, right_id->second), Merge{rank++, result->second});
  }
}

std::vector<int32_t> GPT2Tokenizer::byte_pair_merge(std::string_view piece) const {
  std::vector<int32_t> word;
  word.reserve(piece.size());
  for (char c : piece) word.push_back(byte_token_[static_cast<unsigned char>(c)]);
  std::vector<int32_t> merged;
  while (word.size() > 1) {
    // The adjacent pair with the lowest merge rank...
    const Merge* best = nullptr;
    int32_t best_left = 0, best_right = 0;
    for (size_t i = 0; i + 1 < word.size(); ++i) {
      auto it = merges_.find(pair_key(word[i], word[i + 1]));
      if (it != merges_.end() && (!best || it->second.rank < best->rank)) {
        best = &it->second;
        best_left = word[i];
        best_right = word[i + 1];
      }
    }
    if (!best) break;
    // ...merged at every place it occurs, left to right without overlap, as encoder.py does.
    merged.clear();
    for (size_t i = 0; i < word.size();) {
      if (i + 1 < word.size() && word[i] == best_left && word[i + 1] == best_right) {
        merged.push_back(best->result);
        i += 2;
      } else {
        merged.push_back(word[i++]);
      }
    }
    word.swap(merged);
  }
  return word;
}

void GPT2Tokenizer::encode_piece(std::string_view piece, std::vector<int32_t>& out) const {
  std::string key(piece);
  {
    std::lock_guard<std::mutex> lock(cache_mutex_);
    if (auto it = cache_.find(key); it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int32_t> ids = byte_pair_merge(piece);
  out.insert(out.end(), ids.begin(), ids.end());
  std::lock_guard<std::mutex> lock(cache_mutex_);
  if (cache_.size() >= kMaxCachedPieces) cache_.clear();
  cache_.emplace(std::move(key), std::move(ids));
}

std::vector<int32_t> GPT2Tokenizer::encode_ordinary(std::string_view text) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3);  // English runs at about 4 bytes per token
  for (std::string_view piece : gpt2_pretokenize(text)) encode_piece(piece, ids);
  return ids;
}

std::vector<int32_t> GPT2Tokenizer::encode(std::string_view text) const {
  if (eot_token_ < 0) return encode_ordinary(text);
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3);
  // Split at each "<|endoftext|>" first, so that no ordinary token spans one.
  for (size_t start = 0;;) {
    size_t found = text.find(kEndOfText, start);
    std::string_view segment = text.substr(start, found == std::string_view::npos ? found : found - start);
    for (std::string_view piece : gpt2_pretokenize(segment)) encode_piece(piece, ids);
    if (found == std::string_view::npos) break;
    ids.push_back(eot_token_);
    start = found + kEndOfText.size();
  }
  return ids;
}

const std::string& GPT2Tokenizer::token_bytes(int32_t id) const {
  PRECIS_CHECK(id >= 0 && id < vocab_size(), "GPT2Tokenizer: token id ", id, " is outside the vocabulary [0, ",
               vocab_size(), "); were these ids made by another tokenizer?");
  return token_bytes_[id];
}

std::string GPT2Tokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string text;
  for (int32_t id : ids) text += token_bytes(id);
  return text;
}

}  // namespace precis
