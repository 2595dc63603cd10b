#include "train/interrupt.h"

#include <signal.h>
#include <unistd.h>

#include <csignal>
#include <cstring>

namespace precis::train {

namespace {

volatile std::sig_atomic_t g_signal = 0;
struct sigaction g_previous_int, g_previous_term;

// Only async-signal-safe calls here: write and _exit.
void write_stderr(const char* text) {
  ssize_t ignored = ::write(STDERR_FILENO, text, std::strlen(text));
  (void)ignored;
}

void on_signal(int signal) {
  if (g_signal != 0) {
    write_stderr("\nprecis: second signal: stopping now, without a checkpoint\n");
    ::_exit(128 + signal);
  }
  g_signal = signal;
  write_stderr(
      "\nprecis: stopping after this step to write a checkpoint (send the signal again, e.g. Ctrl-C, to stop at "
      "once)\n");
}

}  // namespace

InterruptScope::InterruptScope() {
  g_signal = 0;
  struct sigaction action {};
  action.sa_handler = on_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;  // file writes and waits carry on; the loop checks the flag after the step
  ::sigaction(SIGINT, &action, &g_previous_int);
  ::sigaction(SIGTERM, &action, &g_previous_term);
}

InterruptScope::~InterruptScope() {
  ::sigaction(SIGINT, &g_previous_int, nullptr);
  ::sigaction(SIGTERM, &g_previous_term, nullptr);
}

int interrupt_signal() { return g_signal; }

const char* signal_name(int signal) {
  switch (signal) {
    case SIGINT:
      return "SIGINT";
    case SIGTERM:
      return "SIGTERM";
    default:
      return "a signal";
  }
}

}  // namespace precis::train
