// OpProfile: which ops a training step ran, each with its time and its cost
// (FLOPs and bytes moved, from ops/op_cost.h), for the per-op table and the
// roofline of `precis profile` (docs/profiling.md).
//
// An op's entry opens an OpScope with its name and a function giving its cost;
// the cost is computed, and the op timed, only while a profile is recording on
// this thread, and only for the outermost scope: an op built from other ops
// (linear on the CPU: a matmul and an add) is one row, and times never count
// twice. The autograd node an op records inherits the op's name and its
// backward cost (core/autograd.cpp); the engine times each node's backward
// function as that op's backward pass.
//
// On the CPU an op's time is the host clock around it (ops run synchronously).
// On a GPU it is a pair of CUDA events on the compute stream around the op's
// launches (core/cuda/profiler_events.h, also an NVTX range), resolved once at
// the end of the step: the GPU time from the op's first launch to its last
// kernel's end. Ops queue in order on one stream, so the op times of a step
// add up to its GPU busy time plus the gaps inside ops; what lies between ops
// (host work the GPU waited for, the data, the copies) is the step's remainder.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/allocator.h"
#include "core/device.h"
#include "core/kernel_trace.h"

namespace precis {

// What an op costs: floating-point operations and bytes read from and written to memory.
// `matrix`: the FLOPs are products that run on the matrix units (Tensor Cores), whose peak
// differs from the vector units' (train/device_peak.h).
struct OpCost {
  double flops = 0;
  double bytes = 0;
  bool matrix = false;
};

// An op's cost both ways: its forward and the backward its autograd node runs.
struct OpWork {
  OpCost forward, backward;
};

// An optimizer's update is neither pass of the model: `step`.
enum class OpPass { forward, backward, step };
const char* op_pass_name(OpPass pass);  // "fwd", "bwd", "step"

struct OpSample {
  std::string op;
  OpPass pass = OpPass::forward;
  OpCost cost;
  double ms = 0;
  double start_ms = 0;  // on the CPU: when the op began, from the step's start (the GPU's ops: 0)
};

// The device allocator's view at one point of a profiled step: at its start and end, and at
// each outermost op's start and end (`at`: "matmul fwd <" on entry, "matmul fwd >" on exit).
// Host time: on a GPU, when the host issued the op (the allocator's bookkeeping is the host's).
struct MemorySample {
  double ms = 0;  // from the step's start
  int64_t allocated = 0, reserved = 0;
  std::string at;
};

// Memory over a profiled step: the allocator's statistics at its ends, its exact peak of live
// bytes (the allocator's, reset at the step's start), and the samples.
struct StepMemory {
  AllocatorStats start, end;
  int64_t peak = 0;
  std::vector<MemorySample> samples;
};

// The ops of one profiled step and its measured time (host clock, device idle at both ends).
// On a GPU with CUPTI, also every kernel, copy and memset the step ran (core/kernel_trace.h),
// each with the index of the op whose scope launched it as its `scope` (-1 outside ops), and
// the step's ends on the trace's clock.
struct ProfiledStep {
  std::vector<OpSample> ops;
  double ms = 0;
  bool traced = false;
  std::vector<GpuActivity> activities;
  int64_t start_ns = 0, end_ns = 0;
  StepMemory memory;
};

class OpProfile {
 public:
  // trace_kernels: on a GPU of a build with CUPTI, also record each step's kernels (tied to
  // their ops, for the kernel tables and the five dimensions). Tracing slows the launches (the
  // runtime and driver calls are recorded too), so an op's event time then includes the GPU's
  // waits for them: a launch-bound op reads longer than untraced (bench/RESULTS.md).
  explicit OpProfile(Device device, bool trace_kernels = false);
  ~OpProfile();
  OpProfile(const OpProfile&) = delete;
  OpProfile& operator=(const OpProfile&) = delete;

  // Waits for the device, makes this the thread's recording profile, starts the step's clock
  // (and, on a GPU of a build with CUPTI, the kernel trace).
  void begin_step();
  // Waits for the device, stops recording, keeps the step (steps()).
  void end_step();
  const std::vector<ProfiledStep>& steps() const { return steps_; }

  // OpScope's side: an outermost op starts and ends.
  void begin_op(const char* op, OpPass pass, const OpCost& cost);
  void end_op();

 private:
  using Clock = std::chrono::steady_clock;
  Device device_;
  std::vector<ProfiledStep> steps_;
  void sample_memory(std::string at);
  Clock::time_point step_start_, op_start_;
  struct GpuEvents;  // the ops' CUDA events (core/cuda/profiler_events.h)
  std::unique_ptr<GpuEvents> gpu_;
  std::unique_ptr<KernelTrace> kernels_;  // on a GPU when the build has CUPTI
};

// Times the enclosing op while a profile records on this thread (see the top).
class OpScope {
 public:
  // A forward op (or an optimizer's `step`, costed by the forward half); `work()` returns its
  // OpWork and is called only when the op is timed.
  template <class WorkFn>
  OpScope(const char* op, WorkFn&& work, OpPass pass = OpPass::forward) {
    if (!enter()) return;
    OpWork w = work();
    open(op, pass, w.forward, w.backward);
  }
  // The backward of an autograd node (core/autograd.cpp).
  OpScope(const char* op, const OpCost& backward_cost);
  ~OpScope();
  OpScope(const OpScope&) = delete;
  OpScope& operator=(const OpScope&) = delete;

 private:
  bool enter();  // true when this scope is the outermost one of a recording profile
  void open(const char* op, OpPass pass, const OpCost& cost, const OpCost& backward);
  bool entered_ = false;
  bool timed_ = false;
};

// For autograd::record: inside an outermost forward OpScope, the op's name and, for the
// first node the op records, its backward cost (later nodes of the same op get none, so
// the cost counts once). False when no profile records or no op is open.
bool op_scope_label(const char** op, OpCost* backward_cost);

}  // namespace precis
