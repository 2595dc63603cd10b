// The step classified along five dimensions, each with its measured time
// (docs/profiling.md): compute, memory traffic, launch overhead and gaps,
// host<->device transfer, synchronisation and idle. The five partition the
// measured step, so they sum to it.
//
// The step is a timeline of activities: on the CPU its ops (host clock), on a GPU
// the kernels, copies and memsets of the kernel trace. Each activity's time goes
// to one dimension:
//  - a kernel (an op on the CPU) inside a costed op: compute or memory, by the op's
//    place on the roofline (memory when bytes / bandwidth >= FLOPs / peak);
//  - a kernel outside any costed op: compute when it ran on Tensor Cores
//    (train/tensor_cores.h), else memory (elementwise work, casts, the optimizer's
//    kernels: they stream data); an op without a cost model likewise memory;
//  - a memset, or a copy device to device: memory; a copy to or from the host (or
//    between GPUs, or a collective on the communication stream): transfer.
// Where two activities overlap (streams), the time goes to the one that began first.
// The time between activities is a gap: one of at most kLaunchGapMs between two
// activities is launch overhead (the device waiting for the host's next launch);
// a longer one, and the time before the first activity and after the last, is
// synchronisation / idle (the device's queue ran dry: the host synchronised, read a
// value back, loaded data or did other work).
#pragma once

#include <array>
#include <string>
#include <vector>

#include "core/op_profile.h"
#include "train/device_peak.h"

namespace precis::train {

enum class StepDimension { compute, memory, launch, transfer, idle };
constexpr int kStepDimensions = 5;
const char* step_dimension_name(StepDimension d);  // "compute", "memory traffic", ...

// The longest gap between two activities counted as launch overhead.
constexpr double kLaunchGapMs = 0.05;

struct TimelineItem {
  double start_ms = 0, end_ms = 0;  // from the step's start
  StepDimension dimension = StepDimension::compute;
};

struct StepDimensions {
  std::array<double, kStepDimensions> ms{};  // by StepDimension
  double step_ms = 0;
  double of(StepDimension d) const { return ms[static_cast<int>(d)]; }
};

// The timeline's split of a step of `step_ms` (items clipped to [0, step_ms]).
StepDimensions classify_timeline(std::vector<TimelineItem> items, double step_ms);

// One profiled step's timeline: its kernels when traced, else its ops.
std::vector<TimelineItem> step_timeline(const ProfiledStep& step, const Roofline& roofline);

// The mean over the steps.
StepDimensions step_dimensions(const std::vector<ProfiledStep>& steps, const Roofline& roofline);

// The five rows, each with its ms and share of the step, and the sum.
std::string format_step_dimensions(const StepDimensions& d, bool from_kernels);

}  // namespace precis::train
