// StepTrace: `profile.trace: path.json` — a Chrome/Perfetto trace of one
// training step. The CPU track shows the profiler's phases (when the host
// issued data, forward, backward, scaler, optimizer); one GPU track per stream
// shows every kernel, memcpy and memset that ran (core/kernel_trace.h), on the
// same clock. After writing it prints the step's kernels by total time.
//
// Tracing costs two device syncs and CUPTI's bookkeeping, in the traced step
// only; the GPU is idle when the step starts, so the trace holds that step alone.
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

  // Right before the step: waits for the GPU, starts recording.
  void begin(Profiler& profiler);
  // Right after it: waits for the GPU, writes the trace, prints the kernel table to `out`.
  void end(Profiler& profiler, int64_t step, std::ostream& out);

 private:
  int64_t to_trace_clock(Profiler::Clock::time_point t) const;

  std::string path_;
  Device device_;
  KernelTrace kernels_;
  Profiler::Clock::time_point step_start_;
  int64_t host_to_trace_ns_ = 0;  // add to a host time (ns since its epoch) to get CUPTI's clock
};

}  // namespace precis::train
