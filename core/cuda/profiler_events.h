// PhaseEvents: the GPU side of core/profiler. Each phase is a pair of CUDA
// events recorded on the compute stream (or the communication stream); resolve() waits once for the last
// event and reads every elapsed time, so timing adds no sync per phase. Each
// phase is also an NVTX range, so Nsight Systems shows the phases by name.
// Only included behind PRECIS_WITH_CUDA.
#pragma once

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
};

}  // namespace precis::cuda
