// What the `precis bench` models share: integer options and the figures' phase table.
#pragma once

#include <cstdint>
#include <string>

#include "cli/commands.h"
#include "train/steady_state.h"

namespace precis::cli {

// The integer option --name (>= min), or `fallback` when it is absent; an error names it otherwise
// (`command` starts the message).
int64_t parse_count(const Options& o, const std::string& name, int64_t fallback, int64_t min,
                    const std::string& command = "bench");
// printf-style formatting of one number.
std::string format(const char* pattern, double value);
// One line per phase (ms per step, share of the step) and "other" (host time outside them).
// `comm` runs during the backward (docs/distributed.md) and is shown but not added.
void print_phases(const train::SteadyState& s);

}  // namespace precis::cli
