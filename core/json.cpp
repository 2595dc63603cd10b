#include "core/json.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <sstream>

#include "core/error.h"
#include "core/utf8.h"

namespace precis {

const char* json_type_name(Json::Type type) {
  switch (type) {
    case Json::Type::null:
      return "null";
    case Json::Type::boolean:
      return "bool";
    case Json::Type::integer:
      return "integer";
    case Json::Type::real:
      return "number";
    case Json::Type::string:
      return "string";
    case Json::Type::array:
      return "array";
    case Json::Type::object:
      return "object";
  }
  return "unknown";
}

Json::Json(uint64_t value) {
  PRECIS_CHECK(value <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()), "Json: the integer ", value,
               " does not fit in int64; store it as a string or a double");
  value_ = static_cast<int64_t>(value);
}

namespace {

[[noreturn]] void wrong_type(const char* wanted, Json::Type actual) {
  PRECIS_FAIL("Json: expected ", wanted, " but the value is ", json_type_name(actual));
}

}  // namespace

bool Json::as_bool() const {
  if (!is_bool()) wrong_type("bool", type());
  return std::get<bool>(value_);
}

double Json::as_double() const {
  if (is_integer()) return static_cast<double>(std::get<int64_t>(value_));
  if (type() != Type::real) wrong_type("a number", type());
  return std::get<double>(value_);
}

int64_t Json::as_int() const {
  if (is_integer()) return std::get<int64_t>(value_);
  if (type() != Type::real) wrong_type("an integer", type());
  double value = std::get<double>(value_);
  // 2^63 is exactly representable; anything at or above it is out of range.
  PRECIS_CHECK(std::trunc(value) == value && value >= -9223372036854775808.0 && value < 9223372036854775808.0,
               "Json: expected an integer but the value is ", value);
  return static_cast<int64_t>(value);
}

const std::string& Json::as_string() const {
  if (!is_string()) wrong_type("string", type());
  return std::get<std::string>(value_);
}

const Json::Array& Json::as_array() const {
  if (!is_array()) wrong_type("array", type());
  return std::get<Array>(value_);
}

Json::Array& Json::as_array() {
  if (!is_array()) wrong_type("array", type());
  return std::get<Array>(value_);
}

const Json::Object& Json::as_object() const {
  if (!is_object()) wrong_type("object", type());
  return std::get<Object>(value_);
}

Json::Object& Json::as_object() {
  if (!is_object()) wrong_type("object", type());
  return std::get<Object>(value_);
}

size_t Json::size() const {
  if (is_array()) return as_array().size();
  if (is_object()) return as_object().size();
  wrong_type("array or object", type());
}

const Json& Json::at(size_t index) const {
  const Array& items = as_array();
  PRECIS_CHECK(index < items.size(), "Json: index ", index, " is out of range for an array of ", items.size(),
               " elements");
  return items[index];
}

void Json::push_back(Json value) { as_array().push_back(std::move(value)); }

bool Json::contains(std::string_view key) const {
  for (const auto& [name, value] : as_object())
    if (name == key) return true;
  return false;
}

const Json& Json::at(std::string_view key) const {
  for (const auto& [name, value] : as_object())
    if (name == key) return value;
  PRECIS_FAIL("Json: the object has no key \"", key, "\"");
}

Json& Json::operator[](std::string_view key) {
  if (is_null()) value_ = Object{};
  Object& members = as_object();
  for (auto& [name, value] : members)
    if (name == key) return value;
  members.emplace_back(std::string(key), Json());
  return members.back().second;
}

// ---------------------------------------------------------------- dump

namespace {

void dump_string(std::string& out, const std::string& text) {
  static const char* kHex = "0123456789abcdef";
  out += '"';
  for (char c : text) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          out += "\\u00";
          out += kHex[(c >> 4) & 0xf];
          out += kHex[c & 0xf];
        } else {
          out += c;
        }
    }
  }
  out += '"';
}

void dump_real(std::string& out, double value) {
  if (std::isnan(value)) {
    out += "NaN";
  } else if (std::isinf(value)) {
    out += value > 0 ? "Infinity" : "-Infinity";
  } else {
    // Shortest text that reads back as the same double.
    char buffer[32];
    auto [end, ec] = std::to_chars(buffer, buffer + sizeof(buffer), value);
    std::string_view text(buffer, end - buffer);
    out += text;
    // Keep a real a real when read back (1.0, not 1), as Python does.
    if (text.find_first_of(".eE") == std::string_view::npos) out += ".0";
  }
}

}  // namespace

void Json::dump_to(std::string& out) const {
  switch (type()) {
    case Type::null:
      out += "null";
      break;
    case Type::boolean:
      out += std::get<bool>(value_) ? "true" : "false";
      break;
    case Type::integer:
      out += std::to_string(std::get<int64_t>(value_));
      break;
    case Type::real:
      dump_real(out, std::get<double>(value_));
      break;
    case Type::string:
      dump_string(out, std::get<std::string>(value_));
      break;
    case Type::array: {
      out += '[';
      bool first = true;
      for (const Json& item : std::get<Array>(value_)) {
        if (!first) out += ',';
        first = false;
        item.dump_to(out);
      }
      out += ']';
      break;
    }
    case Type::object: {
      out += '{';
      bool first = true;
      for (const auto& [key, value] : std::get<Object>(value_)) {
        if (!first) out += ',';
        first = false;
        dump_string(out, key);
        out += ':';
        value.dump_to(out);
      }
      out += '}';
      break;
    }
  }
}

std::string Json::dump() const {
  std::string out;
  dump_to(out);
  return out;
}

// ---------------------------------------------------------------- parse

namespace {

// A recursive-descent parser over the grammar of RFC 8259 (plus NaN/Infinity).
class Parser {
 public:
  Parser(std::string_view text, const std::string& source) : text_(text), source_(source) {}

  Json parse_document() {
    skip_whitespace();
    Json value = parse_value(0);
    skip_whitespace();
    if (pos_ != text_.size()) fail("unexpected text after the JSON value");
    return value;
  }

 private:
  // Deep enough for any real file; stops malicious nesting from overflowing the stack.
  static constexpr int kMaxDepth = 512;

  [[noreturn]] void fail(const std::string& what) const {
    int64_t line = 1, column = 1;
    for (size_t i = 0; i < pos_ && i < text_.size(); ++i) {
      if (text_[i] == '\n') {
        ++line;
        column = 1;
      } else {
        ++column;
      }
    }
    PRECIS_FAIL(source_, ": invalid JSON at line ", line, ", column ", column, ": ", what);
  }

  bool at_end() const { return pos_ >= text_.size(); }
  char peek() const { return at_end() ? '\0' : text_[pos_]; }

  void skip_whitespace() {
    while (!at_end() && (peek() == ' ' || peek() == '\t' || peek() == '\n' || peek() == '\r')) ++pos_;
  }

  bool consume_word(std::string_view word) {
    if (text_.substr(pos_, word.size()) != word) return false;
    pos_ += word.size();
    return true;
  }

  void expect(char c) {
    if (peek() != c) fail(std::string("expected '") + c + "'" + describe_next());
    ++pos_;
  }

  std::string describe_next() const {
    if (at_end()) return " but the text ended";
    return std::string(" but found '") + peek() + "'";
  }

  Json parse_value(int depth) {
    if (depth > kMaxDepth) fail("nesting deeper than 512 levels");
    switch (peek()) {
      case '{':
        return parse_object(depth);
      case '[':
        return parse_array(depth);
      case '"':
        return Json(parse_string());
      case 't':
        if (consume_word("true")) return Json(true);
        break;
      case 'f':
        if (consume_word("false")) return Json(false);
        break;
      case 'n':
        if (consume_word("null")) return Json();
        break;
      case 'N':
        if (consume_word("NaN")) return Json(std::numeric_limits<double>::quiet_NaN());
        break;
      case 'I':
        if (consume_word("Infinity")) return Json(std::numeric_limits<double>::infinity());
        break;
      default:
        if (peek() == '-' || (peek() >= '0' && peek() <= '9')) return parse_number();
    }
    fail("expected a value" + describe_next());
  }

  Json parse_object(int depth) {
    expect('{');
    Json result = Json::object();
    skip_whitespace();
    if (peek() == '}') {
      ++pos_;
      return result;
    }
    while (true) {
      skip_whitespace();
      if (peek() != '"') fail("expected a string key" + describe_next());
      std::string key = parse_string();
      skip_whitespace();
      expect(':');
      skip_whitespace();
      result.as_object().emplace_back(std::move(key), parse_value(depth + 1));
      skip_whitespace();
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      if (peek() == '}') {
        ++pos_;
        return result;
      }
      fail("expected ',' or '}' in an object" + describe_next());
    }
  }

  Json parse_array(int depth) {
    expect('[');
    Json result = Json::array();
    skip_whitespace();
    if (peek() == ']') {
      ++pos_;
      return result;
    }
    while (true) {
      skip_whitespace();
      result.push_back(parse_value(depth + 1));
      skip_whitespace();
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      if (peek() == ']') {
        ++pos_;
        return result;
      }
      fail("expected ',' or ']' in an array" + describe_next());
    }
  }

  Json parse_number() {
    size_t start = pos_;
    if (consume_word("-Infinity")) return Json(-std::numeric_limits<double>::infinity());
    auto digits = [&] {
      size_t first = pos_;
      while (!at_end() && peek() >= '0' && peek() <= '9') ++pos_;
      return pos_ - first;
    };
    if (peek() == '-') ++pos_;
    if (peek() == '0') {
      ++pos_;  // JSON forbids leading zeros, so a 0 ends the integer part
    } else if (digits() == 0) {
      fail("expected a digit" + describe_next());
    }
    bool integral = true;
    if (peek() == '.') {
      ++pos_;
      integral = false;
      if (digits() == 0) fail("expected a digit after the decimal point" + describe_next());
    }
    if (peek() == 'e' || peek() == 'E') {
      ++pos_;
      integral = false;
      if (peek() == '+' || peek() == '-') ++pos_;
      if (digits() == 0) fail("expected a digit in the exponent" + describe_next());
    }
    const char* first = text_.data() + start;
    const char* last = text_.data() + pos_;
    if (integral) {
      int64_t value = 0;
      auto [end, ec] = std::from_chars(first, last, value);
      if (ec == std::errc() && end == last) return Json(value);
      // Too big for int64: keep it as the nearest double, as Python's float() would.
    }
    double value = 0;
    auto [end, ec] = std::from_chars(first, last, value);
    if (ec == std::errc::result_out_of_range) {
      pos_ = start;
      fail("the number " + std::string(first, last) + " is out of the range of a double");
    }
    return Json(value);
  }

  uint32_t parse_hex4() {
    uint32_t value = 0;
    for (int i = 0; i < 4; ++i) {
      char c = peek();
      uint32_t digit;
      if (c >= '0' && c <= '9')
        digit = c - '0';
      else if (c >= 'a' && c <= 'f')
        digit = c - 'a' + 10;
      else if (c >= 'A' && c <= 'F')
        digit = c - 'A' + 10;
      else
        fail("expected 4 hex digits after \\u" + describe_next());
      value = value * 16 + digit;
      ++pos_;
    }
    return value;
  }

  // \uXXXX, with a UTF-16 surrogate pair (\uD83D\uDE00) joined into one code point.
  uint32_t parse_unicode_escape() {
    uint32_t unit = parse_hex4();
    if (unit >= 0xDC00 && unit <= 0xDFFF) fail("a low surrogate \\u" + hex(unit) + " without a high one before it");
    if (unit < 0xD800 || unit > 0xDBFF) return unit;
    if (!consume_word("\\u")) fail("the high surrogate \\u" + hex(unit) + " must be followed by a \\u low surrogate");
    uint32_t low = parse_hex4();
    if (low < 0xDC00 || low > 0xDFFF)
      fail("the high surrogate \\u" + hex(unit) + " is followed by \\u" + hex(low) + ", which is not a low surrogate");
    return 0x10000 + ((unit - 0xD800) << 10) + (low - 0xDC00);
  }

  static std::string hex(uint32_t unit) {
    char buffer[8];
    std::snprintf(buffer, sizeof(buffer), "%04X", unit);
    return buffer;
  }

  std::string parse_string() {
    expect('"');
    std::string out;
    while (true) {
      if (at_end()) fail("the string is not closed with '\"'");
      char c = text_[pos_];
      if (c == '"') {
        ++pos_;
        return out;
      }
      if (static_cast<unsigned char>(c) < 0x20) fail("a raw control character in a string; write it as an escape");
      if (c != '\\') {
        out += c;
        ++pos_;
        continue;
      }
      ++pos_;
      if (at_end()) fail("the string is not closed with '\"'");
      char escape = text_[pos_];
      ++pos_;
      switch (escape) {
        case '"':
          out += '"';
          break;
        case '\\':
          out += '\\';
          break;
        case '/':
          out += '/';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'n':
          out += '\n';
          break;
        case 'r':
          out += '\r';
          break;
        case 't':
          out += '\t';
          break;
        case 'u':
          append_utf8(out, parse_unicode_escape());
          break;
        default:
          --pos_;
          fail("unknown escape '\\" + std::string(1, escape) + "' in a string");
      }
    }
  }

  std::string_view text_;
  const std::string& source_;
  size_t pos_ = 0;
};

}  // namespace

Json Json::parse(std::string_view text, const std::string& source) { return Parser(text, source).parse_document(); }

Json read_json_file(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  PRECIS_CHECK(file, "cannot open the JSON file ", path, ": check that the path exists and is readable");
  std::ostringstream contents;
  contents << file.rdbuf();
  return Json::parse(contents.str(), path);
}

}  // namespace precis
