// Profiler: time per named phase of a training step (data, forward, backward,
// optimizer, ...), summed over a log interval and read once per interval.
//
// On the CPU a phase is wall-clock time (steady_clock). On the GPU a phase is
// bracketed by CUDA events recorded on the compute stream and resolved only
// when the interval is read, so measuring never adds a device sync per phase
// (docs/architecture.md, "How a step flows"). In CUDA builds each GPU phase is also an NVTX range.
//
// A phase may be timed on the communication stream instead (Stream::communication:
// a collective's time on a GPU, distributed/); on the CPU both are the host clock.
//
// For a trace (train/step_trace.h) it can also keep the CPU-side start and end
// of every phase: the time the host spent issuing that phase's work.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/device.h"

namespace precis {

class Profiler {
 public:
  using Clock = std::chrono::steady_clock;
  // Which of the device's streams a GPU phase's events are recorded on.
  enum class Stream { compute, communication };
  struct Span {
    std::string name;
    Clock::time_point start, end;
  };

  // RAII: times the enclosing scope as `phase`.
  class Phase {
   public:
    Phase(Profiler& profiler, const char* name) : profiler_(profiler) { profiler_.begin(name); }
    ~Phase() { profiler_.end(); }
    Phase(const Phase&) = delete;
    Phase& operator=(const Phase&) = delete;

   private:
    Profiler& profiler_;
  };

  Profiler();
  ~Profiler();
  // Phases after this are timed on `device` (CUDA events on its compute stream for a GPU).
  void set_device(Device device);
  void begin(const char* name, Stream stream = Stream::compute);
  void end();
  // Milliseconds per phase since the last call, in first-seen order; resets the totals.
  std::vector<std::pair<std::string, double>> take_ms();
  // While on, every ended phase is kept as a Span (host clock), in the order phases end.
  void record_spans(bool on) { recording_spans_ = on; }
  // The spans kept since the last call; clears them.
  std::vector<Span> take_spans();

  // Phases under CUDA graphs (core/cuda_graph.h). Between begin_graph_capture() and
  // end_graph_capture() a GPU phase's two events are recorded into the graph being captured
  // (event record nodes) instead of being timed. Once the graph is made, keep_graph_phases
  // keeps the phases whose events `in_graph` finds among its nodes (CudaGraph::has_event_node).
  // Before each replay, graph_replay_events() makes fresh events for those phases, pending
  // like any phase's, and returns the (captured, fresh) pairs for CudaGraph::replay to swap
  // into the graph: each replay's phases are then timed, and take_ms sums them as eager
  // steps'. No-ops on the CPU (no graphs there).
  void begin_graph_capture();
  void end_graph_capture();
  void keep_graph_phases(const std::function<bool(void*)>& in_graph);
  std::vector<std::pair<void*, void*>> graph_replay_events();
  // Whether the last capture holds timed phases.
  bool graph_has_phases() const { return graph_phases_; }

 private:
  struct Open {
    std::string name;
    Clock::time_point start;
  };
  void add(const std::string& name, double ms);

  std::vector<Open> open_;
  std::vector<std::pair<std::string, double>> totals_;
  bool recording_spans_ = false;
  std::vector<Span> spans_;
  Device device_ = Device::cpu();
  bool graph_phases_ = false;
  struct GpuEvents;  // CUDA events of the phases not yet resolved (core/cuda/profiler_events.cu)
  std::unique_ptr<GpuEvents> gpu_;
};

}  // namespace precis
