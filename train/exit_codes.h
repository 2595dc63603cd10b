// The `precis` exit codes (docs/config.md, "Exit codes") and the error that carries one:
// a run that ends on purpose (non-finite training, a signal) says why and exits with its own
// code, so a job script can tell "diverged" and "interrupted, checkpoint saved" from a crash.
#pragma once

#include <string>

#include "core/error.h"

namespace precis::train {

inline constexpr int kExitError = 1;      // a precis::Error: a bad config, a damaged file, ...
inline constexpr int kExitUsage = 2;      // the command line itself: an unknown command or option, missing arguments
inline constexpr int kExitNonFinite = 3;  // training stopped on non-finite gradients or weights
inline constexpr int kExitInternal = 70;  // any other exception (a bug; sysexits' EX_SOFTWARE)
// A run stopped by a signal exits 128 + the signal's number: 130 for SIGINT, 143 for SIGTERM.
inline constexpr int exit_code_for_signal(int signal) { return 128 + signal; }

class StoppedRun : public Error {
 public:
  StoppedRun(const std::string& message, int exit_code) : Error(message), exit_code_(exit_code) {}
  int exit_code() const { return exit_code_; }

 private:
  int exit_code_;
};

}  // namespace precis::train
