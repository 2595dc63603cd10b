#include "train/op_table.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <ostream>

#include "train/kernel_table.h"
#include "train/op_kernels.h"
#include "train/step_dimensions.h"
#include "train/svg_plot.h"

namespace precis::train {

namespace {

std::string label_of(const OpRow& row) { return row.op + " " + op_pass_name(row.pass); }

// "1.23 G", "45.6 T": a rate or count in engineering units.
std::string si(double v) {
  static const char* units[] = {"", "k", "M", "G", "T", "P"};
  int u = 0;
  while (v >= 1000 && u < 5) v /= 1000, ++u;
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g%s", v, units[u]);
  return buf;
}

}  // namespace

OpTable op_table(const std::vector<ProfiledStep>& steps) {
  OpTable table;
  std::map<std::pair<std::string, OpPass>, OpRow> rows;
  for (const ProfiledStep& step : steps) {
    table.step_ms += step.ms;
    for (const OpSample& s : step.ops) {
      OpRow& row = rows[{s.op, s.pass}];
      row.calls += 1;
      row.ms += s.ms;
      row.cost.flops += s.cost.flops;
      row.cost.bytes += s.cost.bytes;
      row.cost.matrix = row.cost.matrix || s.cost.matrix;
    }
  }
  table.steps = static_cast<int64_t>(steps.size());
  const double n = std::max<double>(1, static_cast<double>(steps.size()));
  table.step_ms /= n;
  for (auto& [key, row] : rows) {
    row.op = key.first;
    row.pass = key.second;
    row.calls /= n, row.ms /= n, row.cost.flops /= n, row.cost.bytes /= n;
    table.op_ms += row.ms;
    table.rows.push_back(row);
  }
  std::stable_sort(table.rows.begin(), table.rows.end(), [](const OpRow& a, const OpRow& b) { return a.ms > b.ms; });
  return table;
}

RooflinePlace place(const OpRow& row, const Roofline& roofline) {
  RooflinePlace p;
  if (row.cost.bytes <= 0 || row.ms <= 0) return p;
  const double seconds = row.ms / 1e3;
  p.costed = true;
  p.intensity = row.cost.flops / row.cost.bytes;
  p.flops_per_s = row.cost.flops / seconds;
  p.bytes_per_s = row.cost.bytes / seconds;
  const double compute_s =
      roofline.compute(row.cost.matrix) > 0 ? row.cost.flops / roofline.compute(row.cost.matrix) : 0;
  const double memory_s = roofline.bytes_per_s > 0 ? row.cost.bytes / roofline.bytes_per_s : 0;
  p.ms_at_roof = std::max(compute_s, memory_s) * 1e3;
  p.memory_bound = memory_s >= compute_s;
  p.roof = row.cost.flops > 0 ? roofline.roof(p.intensity, row.cost.matrix) : 0;
  p.of_roof = p.ms_at_roof / row.ms;  // = achieved / attainable, for FLOP-free rows by bandwidth
  return p;
}

std::string format_op_table(const OpTable& table, const Roofline& roofline, size_t top) {
  auto percent = [&](double ms) { return table.step_ms > 0 ? 100.0 * ms / table.step_ms : 0.0; };
  char line[320];
  std::string out;
  std::snprintf(line, sizeof line, "%-26s %4s %7s %9s %8s %6s %8s %8s %8s %8s %7s %9s %6s %s\n", "op", "pass", "calls",
                "total ms", "mean ms", "% step", "FLOPs", "bytes", "FLOP/s", "B/s", "FLOP/B", "roof", "% roof",
                "bound");
  out += line;
  OpRow rest;
  for (size_t i = 0; i < table.rows.size(); ++i) {
    const OpRow& r = table.rows[i];
    if (i >= top) {
      rest.calls += r.calls, rest.ms += r.ms;
      continue;
    }
    const RooflinePlace p = place(r, roofline);
    const std::string op = r.op.size() > 26 ? r.op.substr(0, 23) + "..." : r.op;
    if (!p.costed) {
      std::snprintf(line, sizeof line, "%-26s %4s %7.0f %9.3f %8.4f %5.1f%% %8s %8s %8s %8s %7s %9s %6s %s\n",
                    op.c_str(), op_pass_name(r.pass), r.calls, r.ms, r.ms / std::max(r.calls, 1.0), percent(r.ms), "-",
                    "-", "-", "-", "-", "-", "-", "(no cost model)");
    } else {
      std::snprintf(line, sizeof line, "%-26s %4s %7.0f %9.3f %8.4f %5.1f%% %8s %8s %8s %8s %7.2f %9s %5.1f%% %s\n",
                    op.c_str(), op_pass_name(r.pass), r.calls, r.ms, r.ms / std::max(r.calls, 1.0), percent(r.ms),
                    si(r.cost.flops).c_str(), si(r.cost.bytes).c_str(), si(p.flops_per_s).c_str(),
                    si(p.bytes_per_s).c_str(), p.intensity, p.roof > 0 ? si(p.roof).c_str() : "-", 100.0 * p.of_roof,
                    p.memory_bound ? "memory" : (r.cost.matrix ? "compute (matrix)" : "compute"));
    }
    out += line;
  }
  if (table.rows.size() > top) {
    std::snprintf(line, sizeof line, "%-26s %4s %7.0f %9.3f %8s %5.1f%%\n",
                  (std::to_string(table.rows.size() - top) + " other ops").c_str(), "", rest.calls, rest.ms, "",
                  percent(rest.ms));
    out += line;
  }
  const double outside = table.step_ms - table.op_ms;
  std::snprintf(line, sizeof line,
                "step %.3f ms (mean of %lld): ops %.3f ms (%.1f%%), outside ops %.3f ms (%.1f%%: data, host work "
                "between ops, gaps, syncs)\n",
                table.step_ms, static_cast<long long>(table.steps), table.op_ms, percent(table.op_ms), outside,
                percent(outside));
  out += line;
  std::snprintf(line, sizeof line, "roofs (%s): matrix %sFLOP/s, vector %sFLOP/s, memory %sB/s; ridge %.1f FLOP/B\n",
                roofline.source.c_str(), si(roofline.matrix_flops).c_str(), si(roofline.vector_flops).c_str(),
                si(roofline.bytes_per_s).c_str(), roofline.bytes_per_s > 0 ? roofline.ridge(true) : 0.0);
  out += line;
  return out;
}

std::vector<AmdahlRow> amdahl_rows(const OpTable& table, const Roofline& roofline, size_t top) {
  std::vector<AmdahlRow> out;
  for (const OpRow& r : table.rows) {
    if (out.size() == top) break;
    const RooflinePlace p = place(r, roofline);
    if (!p.costed) continue;
    AmdahlRow a{label_of(r), r.ms, std::min(p.ms_at_roof, r.ms), 0, 1};
    a.step_ms_after = table.step_ms - (a.ms - a.ms_at_roof);
    a.speedup = a.step_ms_after > 0 ? table.step_ms / a.step_ms_after : 1;
    out.push_back(a);
  }
  return out;
}

std::string format_amdahl_table(const OpTable& table, const Roofline& roofline, size_t top) {
  char line[256];
  std::snprintf(line, sizeof line, "%-32s %9s %11s %13s %8s\n", "if this op ran at its roof", "ms now", "ms at roof",
                "step ms after", "speedup");
  std::string out = line;
  for (const AmdahlRow& a : amdahl_rows(table, roofline, top)) {
    std::snprintf(line, sizeof line, "%-32s %9.3f %11.4f %13.3f %7.3fx\n", a.label.c_str(), a.ms, a.ms_at_roof,
                  a.step_ms_after, a.speedup);
    out += line;
  }
  return out;
}

void write_roofline_svg(const std::string& path, const OpTable& table, const Roofline& roofline,
                        const std::string& title) {
  std::vector<PlotPoint> points;
  double lo = 1e-2, hi = 1e3;
  for (const OpRow& r : table.rows) {
    const RooflinePlace p = place(r, roofline);
    if (!p.costed || r.cost.flops <= 0) continue;  // FLOP-free ops have no place on a FLOP/s axis
    points.push_back({label_of(r), p.intensity, p.flops_per_s});
    lo = std::min(lo, p.intensity / 2), hi = std::max(hi, p.intensity * 2);
  }
  // Each roof: the bandwidth slope up to its ridge, then flat at its compute peak.
  std::vector<PlotSeries> roofs;
  std::vector<PlotPoint> ridges;
  for (bool matrix : {true, false}) {
    if (!matrix && roofline.vector_flops == roofline.matrix_flops) break;
    const double ridge = roofline.ridge(matrix);
    const std::string name = matrix ? "matrix" : "vector";
    roofs.push_back({name + " roof " + si(roofline.compute(matrix)) + "FLOP/s",
                     {lo, ridge, std::max(hi, ridge * 2)},
                     {roofline.roof(lo, matrix), roofline.compute(matrix), roofline.compute(matrix)}});
    ridges.push_back({name + " ridge " + si(ridge) + " FLOP/B", ridge, 0});
  }
  write_svg_loglog(path, title + " (memory " + si(roofline.bytes_per_s) + "B/s)", "arithmetic intensity (FLOP/byte)",
                   "achieved FLOP/s", roofs, points, ridges);
}

void print_op_profile(std::ostream& out, const std::vector<ProfiledStep>& steps, const Roofline& roofline,
                      const std::string& svg_path) {
  const OpTable table = op_table(steps);
  out << "\n==== ops per step (forward and backward apart; the most time first) ====\n"
      << format_op_table(table, roofline) << "\n==== Amdahl: the step if one op ran at its roof ====\n"
      << format_amdahl_table(table, roofline);
  const bool traced = !steps.empty() && steps.front().traced;
  out << "\n" << format_step_dimensions(step_dimensions(steps, roofline), traced);
  if (traced) {
    std::vector<GpuActivity> step_work;  // the collectives overlap the step and are not its kernels
    for (const ProfiledStep& step : steps)
      for (const GpuActivity& a : step.activities)
        if (a.role != GpuActivity::Stream::communication) step_work.push_back(a);
    std::vector<KernelTotal> totals = kernel_totals(step_work);
    for (KernelTotal& k : totals) k.calls /= static_cast<int64_t>(steps.size()), k.total_ms /= steps.size();
    out << "\n==== kernels per step (the most time first; TC: the Tensor Core input type) ====\n"
        << kernel_table(totals, table.step_ms, 25) << "\n==== kernels by op ====\n"
        << format_kernels_by_op(kernels_by_op(steps));
  }
  write_roofline_svg(svg_path, table, roofline, "roofline of the profiled step's ops");
  out << "roofline     " << svg_path << "\n" << std::flush;
}

}  // namespace precis::train
