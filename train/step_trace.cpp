#include "train/step_trace.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <ostream>

#include "core/error.h"
#include "core/gpu.h"
#include "core/pinned.h"
#include "core/trace_json.h"
#include "train/kernel_table.h"

namespace precis::train {

namespace {

constexpr int kCpuPid = 0;
constexpr int kGpuPid = 1;

int64_t host_ns(Profiler::Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

}  // namespace

std::string rank_trace_path(const std::string& path, int rank) {
  if (rank == 0) return path;
  const std::string tag = ".rank" + std::to_string(rank);
  const size_t slash = path.find_last_of('/');
  const size_t dot = path.find_last_of('.');
  const bool has_extension = dot != std::string::npos && dot > 0 && (slash == std::string::npos || dot > slash + 1);
  return has_extension ? path.substr(0, dot) + tag + path.substr(dot) : path + tag;
}

StepTrace::StepTrace(std::string path, Device device) : path_(std::move(path)), device_(device) {
  check_writable(path_, "profile.trace");
  PRECIS_CHECK(kernel_trace_available(), "profile.trace: ", kernel_trace_unavailable_reason());
  PRECIS_CHECK(device_.is_cuda(), "profile.trace records GPU kernels, but this run is on the ", device_,
               "; use device: cuda, or leave profile.trace empty");
}

int64_t StepTrace::to_trace_clock(Profiler::Clock::time_point t) const { return host_ns(t) + host_to_trace_ns_; }

void StepTrace::begin(Profiler& profiler) {
  synchronize(device_);  // the previous step's kernels stay out of this trace
  kernels_.start();
  // The offset between the host clock and CUPTI's, read back to back.
  auto before = Profiler::Clock::now();
  int64_t trace_now = KernelTrace::now_ns();
  auto after = Profiler::Clock::now();
  host_to_trace_ns_ = trace_now - (host_ns(before) + host_ns(after)) / 2;
  profiler.take_spans();
  profiler.record_spans(true);
  step_start_ = Profiler::Clock::now();
}

void StepTrace::end(Profiler& profiler, int64_t first, int64_t last, std::ostream& out) {
  const std::string label =
      first == last ? "step " + std::to_string(first) : "steps " + std::to_string(first) + "-" + std::to_string(last);
  auto host_end = Profiler::Clock::now();
  std::vector<GpuActivity> activities = kernels_.stop();
  profiler.record_spans(false);
  std::vector<Profiler::Span> spans = profiler.take_spans();

  const int64_t origin = to_trace_clock(step_start_);
  int64_t end_ns = to_trace_clock(host_end);
  for (const GpuActivity& a : activities) end_ns = std::max(end_ns, a.end_ns);
  const double step_ms = static_cast<double>(end_ns - origin) / 1e6;
  auto us = [origin](int64_t ns) { return static_cast<double>(ns - origin) / 1e3; };

  std::vector<TraceTrack> tracks = {{kCpuPid, 0, "CPU", "phases (host)"}};
  std::vector<TraceEvent> events;
  events.push_back({label, "step", kCpuPid, 0, 0.0, step_ms * 1e3});
  for (const Profiler::Span& s : spans) {
    int64_t start = to_trace_clock(s.start);
    events.push_back(
        {s.name, "phase", kCpuPid, 0, us(start), static_cast<double>(to_trace_clock(s.end) - start) / 1e3});
  }
  std::map<uint32_t, bool> streams;
  const std::string gpu_name = device_.str() + " " + cuda_device_name(device_.index);
  for (const GpuActivity& a : activities) {
    if (!streams[a.stream]) {
      streams[a.stream] = true;
      tracks.push_back({kGpuPid, static_cast<int>(a.stream), "GPU " + gpu_name,
                        "stream " + std::to_string(a.stream) + " (" + stream_role_name(a.role) + ")"});
    }
    TraceEvent e{a.name,         activity_kind_name(a.kind),
                 kGpuPid,        static_cast<int>(a.stream),
                 us(a.start_ns), static_cast<double>(a.end_ns - a.start_ns) / 1e3};
    if (a.kind != GpuActivity::Kind::kernel) e.args["bytes"] = a.bytes;
    events.push_back(std::move(e));
  }
  // Time 0 on the host's steady clock (CLOCK_MONOTONIC, one clock for every process of the
  // host): the ranks of a data-parallel run each write a trace whose times start at their own
  // step, and scripts/trace_ranks.py puts them on this common clock.
  Json other = Json::object();
  other["origin_steady_ns"] = host_ns(step_start_);
  write_chrome_trace(path_, tracks, events, other);

  // The table is the step's own work; the collectives of the communication stream overlap it
  // and are summed apart (their time is comm in the step breakdown).
  std::vector<GpuActivity> step_work, collectives;
  for (const GpuActivity& a : activities)
    (a.role == GpuActivity::Stream::communication ? collectives : step_work).push_back(a);
  std::vector<KernelTotal> totals = kernel_totals(step_work);
  double kernel_ms = 0;
  int64_t launches = 0;
  for (const KernelTotal& k : totals) {
    kernel_ms += k.total_ms;
    launches += k.calls;
  }
  char head[256];
  out << "trace of " << label << ": " << path_ << " (" << activities.size()
      << " GPU events; open in ui.perfetto.dev)\n";
  std::snprintf(head, sizeof head, "%s %.3f ms; %lld kernel launches, %.3f ms of kernels (%.1f%% of the %s)\n",
                label.c_str(), step_ms, static_cast<long long>(launches), kernel_ms,
                step_ms > 0 ? 100.0 * kernel_ms / step_ms : 0.0, first == last ? "step" : "steps");
  out << head;
  if (!collectives.empty()) {
    double comm_ms = 0;
    int64_t comm_launches = 0;
    for (const KernelTotal& k : kernel_totals(collectives)) {
      comm_ms += k.total_ms;
      comm_launches += k.calls;
    }
    std::snprintf(head, sizeof head,
                  "communication stream: %lld kernel launches, %.3f ms, overlapping the kernels below (not in them)\n",
                  static_cast<long long>(comm_launches), comm_ms);
    out << head;
  }
  out << kernel_table(totals, step_ms) << std::flush;
}

}  // namespace precis::train
