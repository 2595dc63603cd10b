#include "data/char_tokenizer.h"

#include <cstdio>
#include <fstream>

#include "core/error.h"

namespace precis {

namespace {

// 'a' for printable ASCII, else the byte in hex, for error messages.
std::string describe_byte(unsigned char byte) {
  char buffer[16];
  if (byte >= 0x20 && byte < 0x7F)
    std::snprintf(buffer, sizeof(buffer), "'%c'", byte);
  else
    std::snprintf(buffer, sizeof(buffer), "byte 0x%02X", byte);
  return buffer;
}

}  // namespace

CharTokenizer::CharTokenizer(std::string chars) : chars_(std::move(chars)) {
  PRECIS_CHECK(!chars_.empty(), "CharTokenizer: the vocabulary is empty; build it from a non-empty text");
  id_of_byte_.fill(-1);
  for (size_t i = 0; i < chars_.size(); ++i) {
    unsigned char byte = static_cast<unsigned char>(chars_[i]);
    PRECIS_CHECK(id_of_byte_[byte] < 0, "CharTokenizer: ", describe_byte(byte),
                 " appears twice in the vocabulary; each byte may have one id only");
    id_of_byte_[byte] = static_cast<int32_t>(i);
  }
}

CharTokenizer CharTokenizer::from_text(std::string_view text) {
  std::array<bool, 256> present{};
  for (char c : text) present[static_cast<unsigned char>(c)] = true;
  std::string chars;
  for (int byte = 0; byte < 256; ++byte)
    if (present[byte]) chars += static_cast<char>(byte);
  return CharTokenizer(std::move(chars));
}

std::vector<int32_t> CharTokenizer::encode(std::string_view text) const {
  std::vector<int32_t> ids(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    unsigned char byte = static_cast<unsigned char>(text[i]);
    ids[i] = id_of_byte_[byte];
    PRECIS_CHECK(ids[i] >= 0, "CharTokenizer: ", describe_byte(byte), " at byte ", i,
                 " of the text is not in the vocabulary of ", chars_.size(),
                 " characters; build the vocabulary from a text that contains it");
  }
  return ids;
}

std::string CharTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string text;
  text.reserve(ids.size());
  for (int32_t id : ids) {
    PRECIS_CHECK(id >= 0 && id < vocab_size(), "CharTokenizer: token id ", id, " is outside the vocabulary [0, ",
                 vocab_size(), "); were these ids made with another vocabulary?");
    text += chars_[id];
  }
  return text;
}

Json CharTokenizer::to_json() const {
  Json bytes = Json::array();
  for (char c : chars_) bytes.push_back(static_cast<int>(static_cast<unsigned char>(c)));
  Json json;
  json["tokenizer"] = "char";
  json["vocab_size"] = vocab_size();
  json["bytes"] = std::move(bytes);
  return json;
}

CharTokenizer CharTokenizer::from_json(const Json& json, const std::string& source) {
  PRECIS_CHECK(json.is_object() && json.contains("tokenizer") && json.at("tokenizer").is_string() &&
                   json.at("tokenizer").as_string() == "char" && json.contains("bytes") && json.at("bytes").is_array(),
               "CharTokenizer: ", source,
               " is not a char vocabulary; expected {\"tokenizer\": \"char\", \"bytes\": [...]} as "
               "`precis tokenize --tokenizer char` writes it");
  std::string chars;
  for (const Json& value : json.at("bytes").as_array()) {
    PRECIS_CHECK(value.is_integer() && value.as_int() >= 0 && value.as_int() < 256, "CharTokenizer: ", source,
                 ": \"bytes\" must hold integers 0..255, found ", value.dump());
    chars += static_cast<char>(value.as_int());
  }
  if (json.contains("vocab_size"))
    PRECIS_CHECK(
        json.at("vocab_size").is_integer() && json.at("vocab_size").as_int() == static_cast<int64_t>(chars.size()),
        "CharTokenizer: ", source, " says vocab_size ", json.at("vocab_size").dump(), " but lists ", chars.size(),
        " bytes; the file is damaged, write it again");
  return CharTokenizer(std::move(chars));
}

void CharTokenizer::save(const std::string& path) const {
  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  PRECIS_CHECK(file, "CharTokenizer: cannot write the vocabulary to ", path,
               ": check that its directory exists and is writable");
  file << to_json().dump() << "\n";
  PRECIS_CHECK(file.good(), "CharTokenizer: writing the vocabulary to ", path, " failed (disk full?)");
}

CharTokenizer CharTokenizer::load(const std::string& path) { return from_json(read_json_file(path), path); }

}  // namespace precis
