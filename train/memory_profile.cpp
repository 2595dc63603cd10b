#include "train/memory_profile.h"

#include <algorithm>
#include <cstdio>
#include <ostream>

#include "nn/flat_parameters.h"
#include "nn/module.h"
#include "optim/optimizer.h"
#include "train/svg_plot.h"

namespace precis::train {

namespace {

constexpr double kMiB = 1024.0 * 1024.0;

double mib(int64_t bytes) { return static_cast<double>(bytes) / kMiB; }

}  // namespace

MemoryOwners memory_owners(const nn::Module& model, const optim::Optimizer& optimizer, DType grad_dtype) {
  MemoryOwners o;
  for (const Tensor& p : model.parameters()) {
    o.parameters += p.numel() * static_cast<int64_t>(element_size(p.dtype()));
    o.gradients += p.numel() * static_cast<int64_t>(element_size(nn::flat_grad_dtype(p.dtype(), grad_dtype)));
  }
  o.optimizer_state = optimizer.state_bytes();
  return o;
}

MemoryBreakdown memory_breakdown(const StepMemory& memory, const MemoryOwners& owners) {
  MemoryBreakdown b;
  b.peak = memory.peak;
  b.parameters = owners.parameters - owners.registered;
  b.registered = owners.registered;
  b.gradients = owners.gradients;
  b.optimizer_state = owners.optimizer_state;
  const int64_t at_start = static_cast<int64_t>(memory.start.allocated_bytes);
  b.workspace = std::max<int64_t>(0, at_start - b.parameters - owners.gradients - owners.optimizer_state);
  // The rest of the peak; what the owners above overstate (flat buffers' padding aside, none) comes off it.
  b.activations = b.peak - b.parameters - b.gradients - b.optimizer_state - b.workspace;
  for (const MemorySample& s : memory.samples) {
    if (s.allocated > b.sampled_peak) b.sampled_peak = s.allocated, b.reserved_at_peak = s.reserved, b.peak_at = s.at;
    b.most_reserved = std::max(b.most_reserved, s.reserved);
  }
  return b;
}

void print_memory_profile(std::ostream& out, const std::vector<ProfiledStep>& steps, const MemoryOwners& owners,
                          const std::string& svg_path) {
  if (steps.empty()) return;
  const StepMemory& memory = steps.back().memory;
  const MemoryBreakdown b = memory_breakdown(memory, owners);
  auto percent = [&](int64_t bytes) { return b.peak > 0 ? 100.0 * static_cast<double>(bytes) / b.peak : 0.0; };
  char line[320];
  out << "\n==== memory over the last profiled step (the device allocator) ====\n";
  std::snprintf(line, sizeof line, "%-44s %10s %7s\n", "owner of the peak", "MiB", "% peak");
  out << line;
  const std::pair<const char*, int64_t> rows[] = {{"parameters", b.parameters},
                                                  {"gradients", b.gradients},
                                                  {"optimizer state", b.optimizer_state},
                                                  {"workspace, buffers (live when the step began)", b.workspace},
                                                  {"activations, temporaries (the step's own)", b.activations}};
  for (const auto& [name, bytes] : rows) {
    std::snprintf(line, sizeof line, "%-44s %10.2f %6.1f%%\n", name, mib(bytes), percent(bytes));
    out << line;
  }
  std::snprintf(line, sizeof line, "%-44s %10.2f\n", "peak allocated", mib(b.peak));
  out << line;
  if (b.registered > 0) {
    std::snprintf(line, sizeof line, "%-44s %10.2f   (outside the allocator: not in its peak)\n",
                  "parameters in NCCL-registered memory", mib(b.registered));
    out << line;
  }
  const int64_t cached_free = b.reserved_at_peak - b.sampled_peak;
  std::snprintf(line, sizeof line,
                "highest sample %.2f MiB at \"%s\"; reserved there %.2f MiB: %.2f MiB cached but free "
                "(fragmentation %.1f%% of reserved)\n",
                mib(b.sampled_peak), b.peak_at.c_str(), mib(b.reserved_at_peak), mib(cached_free),
                b.reserved_at_peak > 0 ? 100.0 * static_cast<double>(cached_free) / b.reserved_at_peak : 0.0);
  out << line;
  const AllocatorStats &s0 = memory.start, &s1 = memory.end;
  std::snprintf(line, sizeof line,
                "allocator over the step: %zu allocations, %zu from the system and %zu returned to it; reserved "
                "%.2f -> %.2f MiB (most %.2f)\n",
                s1.num_allocs - s0.num_allocs, s1.num_system_allocs - s0.num_system_allocs,
                s1.num_system_frees - s0.num_system_frees, mib(static_cast<int64_t>(s0.reserved_bytes)),
                mib(static_cast<int64_t>(s1.reserved_bytes)), mib(b.most_reserved));
  out << line;
  PlotSeries allocated{"allocated", {}, {}}, reserved{"reserved", {}, {}};
  for (const MemorySample& m : memory.samples) {
    allocated.x.push_back(m.ms), allocated.y.push_back(mib(m.allocated));
    reserved.x.push_back(m.ms), reserved.y.push_back(mib(m.reserved));
  }
  write_svg_plot(svg_path, "device memory over one profiled step", "ms into the step (host clock)", "MiB",
                 {allocated, reserved});
  out << "memory plot  " << svg_path << "\n" << std::flush;
}

}  // namespace precis::train
