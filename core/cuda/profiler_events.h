// PhaseEvents: the GPU side of core/profiler. Each phase is a pair of CUDA
// events recorded on the compute stream (or the communication stream); resolve() waits once for the last
// event and reads every elapsed time, so timing adds no sync per phase. Each
// phase is also an NVTX range, so Nsight Systems shows the phases by name.
// Only included behind PRECIS_WITH_CUDA.
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "core/device.h"

namespace precis::cuda {

class PhaseEvents {
 public:
  explicit PhaseEvents(Device device);
  ~PhaseEvents();
  PhaseEvents(const PhaseEvents&) = delete;
  PhaseEvents& operator=(const PhaseEvents&) = delete;

  // `communication`: the phase's events go on the communication stream.
  void begin(const std::string& name, bool communication = false);
  void end();
  // Milliseconds of each recorded phase since the last resolve, in record order.
  std::vector<std::pair<std::string, double>> resolve();

  // While capturing, begin() and end() record their events into the CUDA graph being captured
  // (event record nodes: cudaEventRecordExternal) and keep the phases apart, untimed.
  void set_capturing(bool on);
  // After the capture: keeps the captured phases whose both events `in_graph` finds.
  void keep_captured(const std::function<bool(void*)>& in_graph);
  // Before each replay: two fresh events per captured phase, pending like any phase's, and the
  // swaps (captured event, fresh event) the replay makes in the graph's event record nodes.
  std::vector<std::pair<void*, void*>> replay_events();
  bool replay_events_empty() const { return captured_.empty(); }

 private:
  struct Pending {
    std::string name;
    void* start;  // cudaEvent_t
    void* stop;
    void* stream;  // cudaStream_t both events are recorded on
  };
  void* take_event();

  Device device_;
  std::vector<Pending> pending_;
  std::vector<size_t> open_;  // indices into pending_ of phases not yet ended
  std::vector<void*> free_;   // events ready for reuse
  bool capturing_ = false;
  std::vector<Pending> captured_;  // the phases recorded into the graph: their events are its nodes'
};

}  // namespace precis::cuda
