#include <nvtx3/nvToolsExt.h>

#include "core/cuda/profiler_events.h"
#include "core/cuda/runtime.h"

namespace precis::cuda {

namespace {
constexpr size_t kEventsBeforeCapture = 64;  // two per phase: a step has a few dozen at most
}  // namespace

PhaseEvents::PhaseEvents(Device device) : device_(device) {}

PhaseEvents::~PhaseEvents() {
  for (auto& p : captured_) pending_.push_back(p);
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
  PRECIS_CUDA_CHECK(cudaEventRecordWithFlags(static_cast<cudaEvent_t>(p.start), stream,
                                             capturing_ ? cudaEventRecordExternal : cudaEventRecordDefault),
                    "profiler event");
  nvtxRangePushA(name.c_str());  // a no-op unless a profiler (nsys, ncu) is attached
  std::vector<Pending>& list = capturing_ ? captured_ : pending_;
  open_.push_back(list.size());
  list.push_back(p);
}

void PhaseEvents::end() {
  DeviceGuard guard(device_);
  size_t index = open_.back();
  open_.pop_back();
  const Pending& p = (capturing_ ? captured_ : pending_)[index];
  PRECIS_CUDA_CHECK(cudaEventRecordWithFlags(static_cast<cudaEvent_t>(p.stop), static_cast<cudaStream_t>(p.stream),
                                             capturing_ ? cudaEventRecordExternal : cudaEventRecordDefault),
                    "profiler event");
  nvtxRangePop();
}

void PhaseEvents::set_capturing(bool on) {
  PRECIS_CHECK(open_.empty(), "profiler: a phase is open across the start or end of a graph capture");
  if (on) {
    // The graph of the earlier capture is gone (CudaGraph::capture replaces it): its events are free.
    for (auto& p : captured_) free_.push_back(p.start), free_.push_back(p.stop);
    captured_.clear();
    // Events for the capture's phases made now, so no event is created while the stream captures.
    DeviceGuard guard(device_);
    while (free_.size() < kEventsBeforeCapture) {
      cudaEvent_t e;
      PRECIS_CUDA_CHECK(cudaEventCreate(&e), "profiler event");
      free_.push_back(e);
    }
  }
  capturing_ = on;
}

void PhaseEvents::keep_captured(const std::function<bool(void*)>& in_graph) {
  std::vector<Pending> kept;
  for (auto& p : captured_) {
    if (in_graph(p.start) && in_graph(p.stop)) {
      kept.push_back(p);
    } else {  // recorded on a stream outside the capture: no node will ever record these
      free_.push_back(p.start), free_.push_back(p.stop);
    }
  }
  captured_ = std::move(kept);
}

std::vector<std::pair<void*, void*>> PhaseEvents::replay_events() {
  std::vector<std::pair<void*, void*>> swaps;
  for (const Pending& p : captured_) {
    Pending fresh{p.name, take_event(), take_event(), p.stream};
    swaps.emplace_back(p.start, fresh.start);
    swaps.emplace_back(p.stop, fresh.stop);
    pending_.push_back(fresh);
  }
  return swaps;
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
