// precis::Error and PRECIS_CHECK: every user mistake becomes one clear message
// that says what was wrong, where, and what to do.
#pragma once

#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace precis {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

namespace detail {
template <typename T>
void write(std::ostream& out, const T& part) {
  out << part;
}
// Shapes and dim lists print as [2, 3].
inline void write(std::ostream& out, const std::vector<int64_t>& values) {
  out << "[";
  for (size_t i = 0; i < values.size(); ++i) out << (i ? ", " : "") << values[i];
  out << "]";
}
template <typename... Parts>
std::string concat(const Parts&... parts) {
  std::ostringstream out;
  (write(out, parts), ...);
  return out.str();
}
}  // namespace detail

}  // namespace precis

// PRECIS_CHECK(cond, parts...): throws precis::Error whose message is the parts
// streamed one after another (anything with operator<<, shapes and dtypes included).
#define PRECIS_CHECK(cond, ...)                                                \
  do {                                                                         \
    if (!(cond)) throw ::precis::Error(::precis::detail::concat(__VA_ARGS__)); \
  } while (0)

#define PRECIS_FAIL(...) throw ::precis::Error(::precis::detail::concat(__VA_ARGS__))
