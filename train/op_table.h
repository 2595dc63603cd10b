// The op profile's tables (docs/profiling.md): the profiled steps' ops summed
// per op and pass, each placed on the device's roofline; the Amdahl table of
// what the step would gain if an op ran at its roof; the roofline plot.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "core/op_profile.h"
#include "train/device_peak.h"

namespace precis::train {

// One op and pass, per step (means over the profiled steps).
struct OpRow {
  std::string op;
  OpPass pass = OpPass::forward;
  double calls = 0;
  double ms = 0;
  OpCost cost;  // summed over the calls; `matrix` when any call ran products
};

struct OpTable {
  std::vector<OpRow> rows;  // the most time first
  double step_ms = 0;       // the measured step (mean)
  double op_ms = 0;         // the rows' sum; step_ms - op_ms ran outside ops
  int64_t steps = 0;
};

OpTable op_table(const std::vector<ProfiledStep>& steps);

// Where a row sits on the roofline. Rows with no FLOPs (copies, gathers) are placed by
// bandwidth alone; rows with no cost known (`costed` false) are not placed.
struct RooflinePlace {
  bool costed = false;
  double intensity = 0;    // FLOPs per byte
  double flops_per_s = 0;  // achieved
  double bytes_per_s = 0;  // achieved
  double roof = 0;         // attainable FLOP/s at this intensity (bandwidth x bytes for FLOP-free rows)
  double of_roof = 0;      // achieved / attainable
  double ms_at_roof = 0;   // the row's time at its roof: max(FLOPs / compute peak, bytes / bandwidth)
  bool memory_bound = false;
};
RooflinePlace place(const OpRow& row, const Roofline& roofline);

// The per-op table, `top` rows and one for the rest, then the time outside ops.
std::string format_op_table(const OpTable& table, const Roofline& roofline, size_t top = 30);

// For the `top` rows by time: the step if that op alone ran at its roof, and the speed-up.
struct AmdahlRow {
  std::string label;  // "matmul fwd"
  double ms = 0, ms_at_roof = 0, step_ms_after = 0, speedup = 1;
};
std::vector<AmdahlRow> amdahl_rows(const OpTable& table, const Roofline& roofline, size_t top = 8);
std::string format_amdahl_table(const OpTable& table, const Roofline& roofline, size_t top = 8);

// The roofline as SVG: every costed row a point, the compute roofs, the bandwidth roof, the ridges.
void write_roofline_svg(const std::string& path, const OpTable& table, const Roofline& roofline,
                        const std::string& title);

// What `precis profile` and `bench --profile` print: the op table and the Amdahl table of the
// profiled steps, and the roofline written to `svg_path` (its path printed too).
void print_op_profile(std::ostream& out, const std::vector<ProfiledStep>& steps, const Roofline& roofline,
                      const std::string& svg_path);

}  // namespace precis::train
