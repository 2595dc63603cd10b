#include "train/step_dimensions.h"

#include <algorithm>
#include <cstdio>

#include "train/kernel_table.h"
#include "train/op_table.h"
#include "train/tensor_cores.h"

namespace precis::train {

namespace {

// An op's dimension by its cost alone (its measured time does not move it across the ridge).
StepDimension op_dimension(const OpSample& s, const Roofline& roofline) {
  OpRow row{s.op, s.pass, 1, 1.0, s.cost};
  const RooflinePlace p = place(row, roofline);
  if (!p.costed) return StepDimension::memory;
  return p.memory_bound ? StepDimension::memory : StepDimension::compute;
}

StepDimension activity_dimension(const GpuActivity& a, const ProfiledStep& step, const Roofline& roofline) {
  if (a.role == GpuActivity::Stream::communication) return StepDimension::transfer;
  if (a.kind == GpuActivity::Kind::memset) return StepDimension::memory;
  if (a.kind == GpuActivity::Kind::memcpy)
    return a.name == "Memcpy DtoD" ? StepDimension::memory : StepDimension::transfer;
  if (a.scope >= 0 && a.scope < static_cast<int64_t>(step.ops.size())) {
    const OpSample& op = step.ops[static_cast<size_t>(a.scope)];
    if (op.cost.bytes > 0) return op_dimension(op, roofline);
  }
  return tensor_core_use(short_kernel_name(a.name)).tensor_cores ? StepDimension::compute : StepDimension::memory;
}

}  // namespace

const char* step_dimension_name(StepDimension d) {
  switch (d) {
    case StepDimension::compute:
      return "compute";
    case StepDimension::memory:
      return "memory traffic";
    case StepDimension::launch:
      return "launch overhead, gaps";
    case StepDimension::transfer:
      return "host<->device transfer";
    case StepDimension::idle:
      return "synchronisation, idle";
  }
  return "?";
}

StepDimensions classify_timeline(std::vector<TimelineItem> items, double step_ms) {
  StepDimensions out;
  out.step_ms = step_ms;
  std::stable_sort(items.begin(), items.end(),
                   [](const TimelineItem& a, const TimelineItem& b) { return a.start_ms < b.start_ms; });
  auto add = [&out](StepDimension d, double ms) { out.ms[static_cast<int>(d)] += ms; };
  double cursor = 0;  // the timeline is classified up to here
  bool any = false;
  for (const TimelineItem& item : items) {
    const double start = std::clamp(item.start_ms, cursor, step_ms);
    const double end = std::min(item.end_ms, step_ms);
    if (end <= start) continue;  // within what an earlier activity already holds
    const double gap = start - cursor;
    add(any && gap <= kLaunchGapMs ? StepDimension::launch : StepDimension::idle, gap);
    add(item.dimension, end - start);
    cursor = end;
    any = true;
  }
  add(StepDimension::idle, step_ms - cursor);
  return out;
}

std::vector<TimelineItem> step_timeline(const ProfiledStep& step, const Roofline& roofline) {
  std::vector<TimelineItem> items;
  if (step.traced) {
    for (const GpuActivity& a : step.activities)
      items.push_back({static_cast<double>(a.start_ns - step.start_ns) / 1e6,
                       static_cast<double>(a.end_ns - step.start_ns) / 1e6, activity_dimension(a, step, roofline)});
  } else {
    for (const OpSample& s : step.ops) items.push_back({s.start_ms, s.start_ms + s.ms, op_dimension(s, roofline)});
  }
  return items;
}

StepDimensions step_dimensions(const std::vector<ProfiledStep>& steps, const Roofline& roofline) {
  StepDimensions mean;
  for (const ProfiledStep& step : steps) {
    const StepDimensions d = classify_timeline(step_timeline(step, roofline), step.ms);
    mean.step_ms += d.step_ms;
    for (int i = 0; i < kStepDimensions; ++i) mean.ms[i] += d.ms[i];
  }
  const double n = std::max<double>(1, static_cast<double>(steps.size()));
  mean.step_ms /= n;
  for (double& ms : mean.ms) ms /= n;
  return mean;
}

std::string format_step_dimensions(const StepDimensions& d, bool from_kernels) {
  char line[256];
  std::snprintf(line, sizeof line,
                "==== the step by dimension (from %s; gaps up to %.0f us count as launch overhead) ====\n",
                from_kernels ? "the kernel trace" : "the ops' host timers", kLaunchGapMs * 1e3);
  std::string out = line;
  std::snprintf(line, sizeof line, "%-26s %9s %7s\n", "dimension", "ms", "% step");
  out += line;
  double sum = 0;
  for (int i = 0; i < kStepDimensions; ++i) {
    sum += d.ms[i];
    std::snprintf(line, sizeof line, "%-26s %9.3f %6.1f%%\n", step_dimension_name(static_cast<StepDimension>(i)),
                  d.ms[i], d.step_ms > 0 ? 100.0 * d.ms[i] / d.step_ms : 0.0);
    out += line;
  }
  std::snprintf(line, sizeof line, "%-26s %9.3f of a %.3f ms step\n", "sum", sum, d.step_ms);
  out += line;
  return out;
}

}  // namespace precis::train
