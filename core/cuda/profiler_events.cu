#include <nvtx3/nvToolsExt.h>

#include "core/cuda/profiler_events.h"
#include "core/cuda/runtime.h"

namespace precis::cuda {

PhaseEvents::PhaseEvents(Device device) : device_(device) {}

PhaseEvents::~PhaseEvents() {
  for (auto& p : pending_) {
    cudaEventDestroy(static_cast<cudaEvent_t>(p.start));
    cudaEventDestroy(static_cast<cudaEvent_t>(p.stop));
  }
  for (void* e : free_) cudaEventDestroy(static_cast<cudaEvent_t>(e));
}

void* PhaseEvents::take_event() {
  if (!free_.empty()) {
    void* e = free_.back();
    free_.pop_back();
    return e;
  }
  cudaEvent_t e;
  PRECIS_CUDA_CHECK(cudaEventCreate(&e), "profiler event");
  return e;
}

void PhaseEvents::begin(const std::string& name, bool communication) {
  DeviceGuard guard(device_);
  cudaStream_t stream = communication ? comm_stream(device_) : compute_stream(device_);
  Pending p{name, take_event(), take_event(), stream};
  PRECIS_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(p.start), stream), "profiler event");
  nvtxRangePushA(name.c_str());  // a no-op unless a profiler (nsys, ncu) is attached
  open_.push_back(pending_.size());
  pending_.push_back(p);
}

void PhaseEvents::end() {
  DeviceGuard guard(device_);
  size_t index = open_.back();
  open_.pop_back();
  PRECIS_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(pending_[index].stop),
                                    static_cast<cudaStream_t>(pending_[index].stream)),
                    "profiler event");
  nvtxRangePop();
}

std::vector<std::pair<std::string, double>> PhaseEvents::resolve() {
  std::vector<std::pair<std::string, double>> out;
  if (pending_.empty()) return out;
  DeviceGuard guard(device_);
  std::vector<Pending> done(pending_.begin(), pending_.end());
  // Phases on two streams need not end in record order: wait for each (a finished one costs nothing).
  for (auto& p : done) PRECIS_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(p.stop)), "profiler resolve");
  for (auto& p : done) {
    float ms = 0;
    PRECIS_CUDA_CHECK(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(p.start), static_cast<cudaEvent_t>(p.stop)),
                      "profiler resolve");
    out.emplace_back(p.name, static_cast<double>(ms));
    free_.push_back(p.start);
    free_.push_back(p.stop);
  }
  pending_.clear();
  return out;
}

}  // namespace precis::cuda
