#include "train/op_kernels.h"

#include <algorithm>
#include <cstdio>
#include <map>

#include "train/kernel_table.h"
#include "train/tensor_cores.h"

namespace precis::train {

namespace {

constexpr const char* kOutsideOps = "(outside ops)";

std::string fit(const std::string& text, size_t width) {
  return text.size() <= width ? text : text.substr(0, width - 3) + "...";
}

}  // namespace

std::vector<OpKernels> kernels_by_op(const std::vector<ProfiledStep>& steps) {
  std::map<std::string, OpKernels> ops;
  std::map<std::string, std::map<std::string, OpKernel>> kernels;  // op label -> kernel name -> totals
  size_t traced = 0;
  for (const ProfiledStep& step : steps) {
    if (!step.traced) continue;
    ++traced;
    for (const OpSample& s : step.ops) ops[s.op + " " + op_pass_name(s.pass)].event_ms += s.ms;
    for (const GpuActivity& a : step.activities) {
      if (a.kind != GpuActivity::Kind::kernel || a.role == GpuActivity::Stream::communication) continue;
      const bool in_op = a.scope >= 0 && a.scope < static_cast<int64_t>(step.ops.size());
      const std::string label = in_op ? step.ops[static_cast<size_t>(a.scope)].op + " " +
                                            op_pass_name(step.ops[static_cast<size_t>(a.scope)].pass)
                                      : kOutsideOps;
      const double ms = static_cast<double>(a.end_ns - a.start_ns) / 1e6;
      ops[label].kernel_ms += ms;
      OpKernel& k = kernels[label][short_kernel_name(a.name)];
      k.calls += 1;
      k.ms += ms;
    }
  }
  std::vector<OpKernels> out;
  if (traced == 0) return out;
  const double n = static_cast<double>(traced);
  OpKernels outside{kOutsideOps, 0, 0, {}};
  for (auto& [label, row] : ops) {
    row.op = label;
    row.event_ms /= n;
    row.kernel_ms /= n;
    for (auto& [name, k] : kernels[label]) {
      k.kernel = name;
      k.tensor_cores = tensor_core_label(tensor_core_use(name));
      k.calls /= n;
      k.ms /= n;
      row.kernels.push_back(k);
    }
    std::stable_sort(row.kernels.begin(), row.kernels.end(),
                     [](const OpKernel& a, const OpKernel& b) { return a.ms > b.ms; });
    if (label == kOutsideOps)
      outside = std::move(row);
    else
      out.push_back(std::move(row));
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const OpKernels& a, const OpKernels& b) { return a.kernel_ms > b.kernel_ms; });
  out.push_back(std::move(outside));
  return out;
}

std::string format_kernels_by_op(const std::vector<OpKernels>& ops, size_t top_ops, size_t top_kernels) {
  char line[320];
  std::snprintf(line, sizeof line, "%-60s %6s %8s %10s %10s\n", "op / its kernels", "TC", "calls", "op ms",
                "kernel ms");
  std::string out = line;
  double total = 0, in_ops = 0;
  size_t shown = 0;
  for (const OpKernels& row : ops) {
    total += row.kernel_ms;
    const bool outside = row.op == kOutsideOps;
    if (!outside) in_ops += row.kernel_ms;
    if (!outside && shown++ >= top_ops) continue;
    if (outside)
      std::snprintf(line, sizeof line, "%-60s %6s %8s %10s %10.3f\n", row.op.c_str(), "", "", "-", row.kernel_ms);
    else
      std::snprintf(line, sizeof line, "%-60s %6s %8s %10.3f %10.3f\n", fit(row.op, 60).c_str(), "", "", row.event_ms,
                    row.kernel_ms);
    out += line;
    for (size_t i = 0; i < row.kernels.size() && i < top_kernels; ++i) {
      const OpKernel& k = row.kernels[i];
      std::snprintf(line, sizeof line, "  %-58s %6s %8.0f %10s %10.3f\n", fit(k.kernel, 58).c_str(),
                    k.tensor_cores.c_str(), k.calls, "", k.ms);
      out += line;
    }
    if (row.kernels.size() > top_kernels) {
      double rest = 0;
      for (size_t i = top_kernels; i < row.kernels.size(); ++i) rest += row.kernels[i].ms;
      std::snprintf(line, sizeof line, "  %-58s %6s %8s %10s %10.3f\n",
                    (std::to_string(row.kernels.size() - top_kernels) + " other kernels").c_str(), "", "", "", rest);
      out += line;
    }
  }
  std::snprintf(line, sizeof line,
                "kernels %.3f ms per step = %.3f in ops + %.3f outside ops (the kernel table's total); an op's ms "
                "over its kernels' is its gaps between launches\n",
                total, in_ops, total - in_ops);
  out += line;
  return out;
}

}  // namespace precis::train
