// StepTrace: `profile.trace: path.json` — a Chrome/Perfetto trace of one
// training step (or of `profile.trace_steps` consecutive ones). The CPU track
// shows the profiler's phases (when the host issued data, forward, backward,
// scaler, optimizer); one GPU track per stream shows every kernel, memcpy and
// memset that ran (core/kernel_trace.h), on the same clock. After writing it
// prints the steps' kernels by total time.
//
// Tracing costs two device syncs and CUPTI's bookkeeping, before the first traced
// step and after the last; the GPU is idle when the first starts, so the trace
// holds the traced steps alone. Between two traced steps nothing waits (unless a
// log line falls there, which waits for the GPU: log_interval): the trace
// shows what runs between steps as the host runs ahead (a replayed graph's end,
// the eager copies, the next replay's start).
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>

#include "core/device.h"
#include "core/kernel_trace.h"
#include "core/profiler.h"

namespace precis::train {

// Where rank `rank` of a data-parallel run writes its trace: `path` for rank 0, else `path` with
// ".rank<rank>" before its extension (step.json -> step.rank1.json; no extension: appended).
std::string rank_trace_path(const std::string& path, int rank);

class StepTrace {
 public:
  // Fails now, not after training, when `path` cannot be written, when the
  // build has no CUPTI, or when `device` is not a GPU.
  StepTrace(std::string path, Device device);

  // Right before the first traced step: waits for the GPU, starts recording.
  void begin(Profiler& profiler);
  // Right after the last: waits for the GPU, writes the trace of steps `first` to `last`,
  // prints the kernel table to `out`.
  void end(Profiler& profiler, int64_t first, int64_t last, std::ostream& out);

 private:
  int64_t to_trace_clock(Profiler::Clock::time_point t) const;

  std::string path_;
  Device device_;
  KernelTrace kernels_;
  Profiler::Clock::time_point step_start_;
  int64_t host_to_trace_ns_ = 0;  // add to a host time (ns since its epoch) to get CUPTI's clock
};

}  // namespace precis::train
