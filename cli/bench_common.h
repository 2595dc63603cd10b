// What the `precis bench` models share: integer options and the figures' phase table.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "cli/commands.h"
#include "core/device.h"
#include "train/steady_state.h"

namespace precis {
class OpProfile;
namespace train {
class Trainer;
}
}  // namespace precis

namespace precis::cli {

// The integer option --name (>= min), or `fallback` when it is absent; an error names it otherwise
// (`command` starts the message).
int64_t parse_count(const Options& o, const std::string& name, int64_t fallback, int64_t min,
                    const std::string& command = "bench");
// Milliseconds per call of `fn`: the median over 5 rounds of `iters` calls of each round's
// mean, after 3 warm-up calls; each round timed with CUDA events on the compute stream on a
// GPU, with the host clock and a synchronisation on the CPU (PyTorch's benchmark method).
double mean_ms(Device device, int iters, const std::function<void()>& fn);
// printf-style formatting of one number.
std::string format(const char* pattern, double value);
// One line per phase (ms per step, share of the step) and "other" (host time outside them).
// `comm` runs during the backward (docs/distributed.md) and is shown but not added.
void print_phases(const train::SteadyState& s);
// What `precis profile` prints after its run (docs/profiling.md): the op, Amdahl and kernel
// tables with the roofline plot (train/op_table.h), the memory profile and its plot, and the
// steps as profile.tsv (train/profile_tsv.h); the plots and the file go to the run's out_dir.
void print_profile(train::Trainer& trainer, const OpProfile& profile);
// The same after a bench's figures (`precis bench gpt2|resnet --profile`), saying first that
// the figures include the profiler's cost.
void print_bench_profile(train::Trainer& trainer, const OpProfile& profile);

}  // namespace precis::cli
