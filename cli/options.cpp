#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <optional>

#include "cli/commands.h"
#include "cli/usage.h"
#include "core/error.h"

namespace precis::cli {

std::string Options::get(const std::string& name, const std::string& fallback) const {
  for (const auto& [key, value] : named)
    if (key == name) return value;
  return fallback;
}

namespace {

// The whole text as a T, or nullopt.
template <typename T>
std::optional<T> parse_whole(const std::string& text) {
  T value{};
  const char* end = text.data() + text.size();
  auto [stop, error] = std::from_chars(text.data(), end, value);
  if (error != std::errc() || stop != end || text.empty()) return std::nullopt;
  return value;
}

}  // namespace

int64_t Options::integer(const std::string& name, int64_t fallback, int64_t min, int64_t max) const {
  const std::string text = get(name, "");
  if (text.empty()) return fallback;
  const std::optional<int64_t> value = parse_whole<int64_t>(text);
  const std::string range = max == std::numeric_limits<int64_t>::max() ? detail::concat(">= ", min)
                                                                       : detail::concat("in [", min, ", ", max, "]");
  PRECIS_CHECK(value && *value >= min && *value <= max, command, ": --", name, " must be an integer ", range, ", got '",
               text, "'");
  return *value;
}

uint64_t Options::unsigned_integer(const std::string& name, uint64_t fallback) const {
  const std::string text = get(name, "");
  if (text.empty()) return fallback;
  const std::optional<uint64_t> value = parse_whole<uint64_t>(text);
  PRECIS_CHECK(value && text[0] != '-', command, ": --", name, " must be an integer >= 0, got '", text, "'");
  return *value;
}

double Options::number(const std::string& name, double fallback, double min, double max) const {
  const std::string text = get(name, "");
  if (text.empty()) return fallback;
  const std::optional<double> value = parse_whole<double>(text);
  PRECIS_CHECK(value && std::isfinite(*value) && *value >= min && *value <= max, command, ": --", name,
               " must be a number in [", min, ", ", max, "], got '", text, "'");
  return *value;
}

Options parse_options(const Args& args, const std::vector<std::string>& known, const std::string& command) {
  Options out;
  out.command = command;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a.rfind("--", 0) != 0) {
      out.positional.push_back(a);
      continue;
    }
    std::string name = a.substr(2), value;
    size_t eq = name.find('=');
    if (eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    } else {
      usage_check(i + 1 < args.size(), command, "option --" + name + " needs a value");
      value = args[++i];
    }
    usage_check(std::find(known.begin(), known.end(), name) != known.end(), command, "unknown option --" + name);
    out.named.emplace_back(name, value);
  }
  return out;
}

}  // namespace precis::cli
