// An on/off switch of the process (a kernel kept off by default until it is measured, or one
// measured and on by default): set() fixes it; until then the environment variable it names is
// read once, "1" turning it on and anything else off, and an unset variable leaving the default.
// Safe to read from any thread.
#pragma once

#include <atomic>
#include <cstdlib>
#include <cstring>

namespace precis {

class EnvSwitch {
 public:
  explicit constexpr EnvSwitch(const char* variable, bool default_on = false)
      : variable_(variable), default_on_(default_on) {}

  void set(bool on) { state_.store(on ? 1 : 0); }

  bool on() {
    int state = state_.load(std::memory_order_relaxed);
    if (state < 0) {
      const char* setting = std::getenv(variable_);
      int unset = -1;
      const bool on_now = setting == nullptr ? default_on_ : std::strcmp(setting, "1") == 0;
      state_.compare_exchange_strong(unset, on_now ? 1 : 0);
      state = state_.load();
    }
    return state == 1;
  }

 private:
  const char* variable_;
  bool default_on_;
  std::atomic<int> state_{-1};  // 0 or 1, -1 until set or read from the environment
};

}  // namespace precis
