#include "train/kernel_table.h"

#include <algorithm>
#include <cstdio>
#include <map>

#include "train/tensor_cores.h"

namespace precis::train {

namespace {

// Where the parameter list of a demangled function name starts: the '(' that
// matches its final ')', or npos when the name has none.
size_t parameter_list_start(const std::string& name) {
  if (name.empty() || name.back() != ')') return std::string::npos;
  int depth = 0;
  for (size_t i = name.size(); i-- > 0;) {
    if (name[i] == ')') ++depth;
    if (name[i] == '(' && --depth == 0) return i;
  }
  return std::string::npos;
}

void erase_all(std::string& text, const std::string& part) {
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at)) text.erase(at, part.size());
}

std::string fit(const std::string& text, size_t width) {
  return text.size() <= width ? text : text.substr(0, width - 3) + "...";
}

}  // namespace

std::string short_kernel_name(const std::string& demangled) {
  std::string name = demangled;
  size_t params = parameter_list_start(name);
  if (params != std::string::npos && params > 0) name.erase(params);
  if (name.rfind("void ", 0) == 0) name.erase(0, 5);
  erase_all(name, "(anonymous namespace)::");
  return name;
}

std::vector<KernelTotal> kernel_totals(const std::vector<GpuActivity>& activities) {
  std::map<std::string, KernelTotal> by_name;
  for (const GpuActivity& a : activities) {
    if (a.kind != GpuActivity::Kind::kernel) continue;
    KernelTotal& total = by_name[short_kernel_name(a.name)];
    total.calls += 1;
    total.total_ms += static_cast<double>(a.end_ns - a.start_ns) / 1e6;
  }
  std::vector<KernelTotal> out;
  for (auto& [name, total] : by_name) {
    total.name = name;
    total.tensor_cores = tensor_core_label(tensor_core_use(name));
    out.push_back(total);
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const KernelTotal& a, const KernelTotal& b) { return a.total_ms > b.total_ms; });
  return out;
}

std::string kernel_table(const std::vector<KernelTotal>& totals, double step_ms, size_t top) {
  constexpr size_t kNameWidth = 72;
  auto percent = [step_ms](double ms) { return step_ms > 0 ? 100.0 * ms / step_ms : 0.0; };
  char line[256];
  std::snprintf(line, sizeof line, "%3s  %-*s %6s %6s %10s %7s\n", "#", static_cast<int>(kNameWidth), "kernel", "TC",
                "calls", "total ms", "% step");
  std::string out = line;
  double rest_ms = 0;
  int64_t rest_calls = 0;
  for (size_t i = 0; i < totals.size(); ++i) {
    const KernelTotal& k = totals[i];
    if (i >= top) {
      rest_ms += k.total_ms;
      rest_calls += k.calls;
      continue;
    }
    std::snprintf(line, sizeof line, "%3zu  %-*s %6s %6lld %10.3f %6.1f%%\n", i + 1, static_cast<int>(kNameWidth),
                  fit(k.name, kNameWidth).c_str(), k.tensor_cores.c_str(), static_cast<long long>(k.calls), k.total_ms,
                  percent(k.total_ms));
    out += line;
  }
  if (totals.size() > top) {
    std::string others = std::to_string(totals.size() - top) + " other kernels";
    std::snprintf(line, sizeof line, "%3s  %-*s %6s %6lld %10.3f %6.1f%%\n", "", static_cast<int>(kNameWidth),
                  others.c_str(), "", static_cast<long long>(rest_calls), rest_ms, percent(rest_ms));
    out += line;
  }
  return out;
}

}  // namespace precis::train
