#include "train/profile_tsv.h"

#include <cstdio>
#include <fstream>
#include <map>
#include <utility>

#include "core/error.h"
#include "train/op_kernels.h"
#include "train/op_table.h"

namespace precis::train {

namespace {

// Copies and memsets per step by the op that launched them and their name.
std::map<std::pair<std::string, std::string>, std::pair<double, double>> copies_by_op(
    const std::vector<ProfiledStep>& steps) {
  std::map<std::pair<std::string, std::string>, std::pair<double, double>> out;  // (op, name) -> (calls, ms)
  double traced = 0;
  for (const ProfiledStep& step : steps) {
    if (!step.traced) continue;
    ++traced;
    for (const GpuActivity& a : step.activities) {
      if (a.kind == GpuActivity::Kind::kernel || a.role == GpuActivity::Stream::communication) continue;
      const bool in_op = a.scope >= 0 && a.scope < static_cast<int64_t>(step.ops.size());
      const OpSample* op = in_op ? &step.ops[static_cast<size_t>(a.scope)] : nullptr;
      auto& [calls, ms] = out[{op ? op->op + " " + op_pass_name(op->pass) : "(outside ops)", a.name}];
      calls += 1;
      ms += static_cast<double>(a.end_ns - a.start_ns) / 1e6;
    }
  }
  for (auto& [key, totals] : out) totals.first /= traced, totals.second /= traced;
  return out;
}

}  // namespace

void write_profile_tsv(const std::string& path, const std::vector<ProfiledStep>& steps) {
  std::ofstream out(path);
  PRECIS_CHECK(out.good(), "profile: cannot write '", path, "'");
  const OpTable table = op_table(steps);
  char line[64];
  auto row = [&](const char* kind, const std::string& op, const std::string& name, double calls, double ms) {
    std::snprintf(line, sizeof line, "\t%.6g\t%.6f\n", calls, ms);
    out << kind << '\t' << op << '\t' << name << line;
  };
  out << "# precis profile: per-step means over " << table.steps << " profiled step(s), times in ms\n"
      << "kind\top\tname\tcalls\tms\n";
  row("step", "-", "-", 1, table.step_ms);
  for (const OpRow& r : table.rows) row("op", r.op + " " + op_pass_name(r.pass), "-", r.calls, r.ms);
  for (const OpKernels& op : kernels_by_op(steps))
    for (const OpKernel& k : op.kernels) row("kernel", op.op, k.kernel, k.calls, k.ms);
  for (const auto& [key, totals] : copies_by_op(steps)) row("copy", key.first, key.second, totals.first, totals.second);
  PRECIS_CHECK(out.good(), "profile: writing '", path, "' failed");
}

}  // namespace precis::train
