#include "core/profiler.h"

#include "core/error.h"

namespace precis {

void Profiler::begin(const char* name) { open_.push_back({name, Clock::now()}); }

void Profiler::end() {
  PRECIS_CHECK(!open_.empty(), "Profiler::end without a matching begin");
  Open phase = std::move(open_.back());
  open_.pop_back();
  double ms = std::chrono::duration<double, std::milli>(Clock::now() - phase.start).count();
  for (auto& [name, total] : totals_) {
    if (name == phase.name) {
      total += ms;
      return;
    }
  }
  totals_.emplace_back(phase.name, ms);
}

std::vector<std::pair<std::string, double>> Profiler::take_ms() {
  auto out = std::move(totals_);
  totals_.clear();
  return out;
}

}  // namespace precis
