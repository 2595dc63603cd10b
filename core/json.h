// Json: a small JSON value for the files Precis reads and writes (GPT-2's
// encoder.json, safetensors headers, metrics.jsonl, data positions).
//
// Numbers remember whether they were written as integers, so int64 values
// (token ids, byte offsets, seeds) round-trip exactly instead of passing
// through a double. Objects keep their keys in insertion order, so dump()
// writes them back in the order they were read or built. Non-finite doubles
// are written as NaN / Infinity / -Infinity, as Python's json module does, so a
// diverged loss still lands in metrics.jsonl; parse() accepts them too.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

namespace precis {

class Json {
 public:
  enum class Type { null, boolean, integer, real, string, array, object };
  using Array = std::vector<Json>;
  using Object = std::vector<std::pair<std::string, Json>>;  // in insertion order

  Json() = default;
  Json(std::nullptr_t) {}
  Json(bool value) : value_(value) {}
  Json(int value) : value_(static_cast<int64_t>(value)) {}
  Json(unsigned value) : value_(static_cast<int64_t>(value)) {}
  Json(int64_t value) : value_(value) {}
  Json(uint64_t value);  // must fit in int64
  Json(double value) : value_(value) {}
  Json(const char* value) : value_(std::string(value)) {}
  Json(std::string value) : value_(std::move(value)) {}
  Json(Array value) : value_(std::move(value)) {}
  Json(Object value) : value_(std::move(value)) {}
  static Json array() { return Json(Array{}); }
  static Json object() { return Json(Object{}); }

  Type type() const { return static_cast<Type>(value_.index()); }
  bool is_null() const { return type() == Type::null; }
  bool is_bool() const { return type() == Type::boolean; }
  bool is_number() const { return type() == Type::integer || type() == Type::real; }
  bool is_integer() const { return type() == Type::integer; }
  bool is_string() const { return type() == Type::string; }
  bool is_array() const { return type() == Type::array; }
  bool is_object() const { return type() == Type::object; }

  // Typed access; a wrong type raises precis::Error naming the expected and actual types.
  bool as_bool() const;
  double as_double() const;  // any number
  int64_t as_int() const;    // an integer, or a real with an exact integer value
  const std::string& as_string() const;
  const Array& as_array() const;
  Array& as_array();
  const Object& as_object() const;
  Object& as_object();

  // Arrays and objects: element count.
  size_t size() const;
  // Arrays.
  const Json& at(size_t index) const;
  void push_back(Json value);
  // Objects. Lookup is a linear scan: the objects Precis looks keys up in are
  // small; the big one (encoder.json) is read by iterating as_object().
  bool contains(std::string_view key) const;
  const Json& at(std::string_view key) const;  // missing key: error naming it
  // Inserts null under a missing key; a null value becomes an empty object first.
  Json& operator[](std::string_view key);

  // Compact JSON text, keys in insertion order, non-ASCII UTF-8 written as is.
  std::string dump() const;
  // `source` (a file name, say) prefixes error messages, which give line and column.
  static Json parse(std::string_view text, const std::string& source = "JSON text");

  friend bool operator==(const Json& a, const Json& b) { return a.value_ == b.value_; }

 private:
  void dump_to(std::string& out) const;

  std::variant<std::monostate, bool, int64_t, double, std::string, Array, Object> value_;
};

const char* json_type_name(Json::Type type);

// Reads and parses a whole file; errors name the path.
Json read_json_file(const std::string& path);

}  // namespace precis
