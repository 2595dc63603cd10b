// An experimental on/off switch of the process (a kernel kept off by default until it is
// measured): set() fixes it; until then the environment variable it names is read once, "1"
// turning it on and anything else, or nothing, leaving it off. Safe to read from any thread.
#pragma once

#include <atomic>
#include <cstdlib>
#include <cstring>

namespace precis {

class EnvSwitch {
 public:
  explicit constexpr EnvSwitch(const char* variable) : variable_(variable) {}

  void set(bool on) { state_.store(on ? 1 : 0); }

  bool on() {
    int state = state_.load(std::memory_order_relaxed);
    if (state < 0) {
      const char* setting = std::getenv(variable_);
      int unset = -1;
      state_.compare_exchange_strong(unset, setting != nullptr && std::strcmp(setting, "1") == 0 ? 1 : 0);
      state = state_.load();
    }
    return state == 1;
  }

 private:
  const char* variable_;
  std::atomic<int> state_{-1};  // 0 or 1, -1 until set or read from the environment
};

}  // namespace precis
