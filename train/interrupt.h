// SIGINT and SIGTERM (Ctrl-C; what Slurm and container runtimes send) during training
// (docs/config.md, "Signals"). While an InterruptScope lives, the first signal only sets a
// flag: the trainer finishes the step, writes a checkpoint, says where, and exits with
// 128 + the signal (train/exit_codes.h). A second one ends the process at once (exit
// 128 + signal, nothing saved), for a run that does not come back from its step.
#pragma once

namespace precis::train {

class InterruptScope {
 public:
  // Installs the handlers (clearing any earlier request); the destructor restores the old ones.
  InterruptScope();
  ~InterruptScope();
  InterruptScope(const InterruptScope&) = delete;
  InterruptScope& operator=(const InterruptScope&) = delete;
};

// The first signal received inside the scope (SIGINT or SIGTERM), or 0.
int interrupt_signal();

// "SIGINT", "SIGTERM", ...
const char* signal_name(int signal);

}  // namespace precis::train
