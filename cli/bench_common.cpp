#include "cli/bench_common.h"

#include <algorithm>
#include <cstdio>

#include "core/error.h"

namespace precis::cli {

int64_t parse_count(const Options& o, const std::string& name, int64_t fallback, int64_t min,
                    const std::string& command) {
  std::string text = o.get(name, "");
  if (text.empty()) return fallback;
  size_t used = 0;
  int64_t value = -1;
  try {
    value = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  PRECIS_CHECK(used == text.size() && value >= min, command, ": --", name, " must be an integer >= ", min, ", got '",
               text, "'");
  return value;
}

std::string format(const char* pattern, double value) {
  char text[64];
  std::snprintf(text, sizeof text, pattern, value);
  return text;
}

void print_phases(const train::SteadyState& s) {
  double phases_ms = 0;
  for (const auto& [name, ms] : s.phase_ms) {
    const bool overlapped = name == "comm";
    if (!overlapped) phases_ms += ms;
    std::printf("  %-12s %8.2f ms %5.1f%%%s\n", name.c_str(), ms, 100.0 * ms / s.ms_per_step,
                overlapped ? "   (during backward and comm_exposed; not added)" : "");
  }
  double other = std::max(0.0, s.ms_per_step - phases_ms);
  std::printf("  %-12s %8.2f ms %5.1f%%   (host time outside the phases)\n", "other", other,
              100.0 * other / s.ms_per_step);
  std::fflush(stdout);
}

}  // namespace precis::cli
