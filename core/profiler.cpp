#include "core/profiler.h"

#include "core/error.h"

#if PRECIS_WITH_CUDA
#include "core/cuda/profiler_events.h"
#endif

namespace precis {

#if PRECIS_WITH_CUDA
struct Profiler::GpuEvents : cuda::PhaseEvents {
  using cuda::PhaseEvents::PhaseEvents;
};
#else
struct Profiler::GpuEvents {};
#endif

Profiler::Profiler() = default;
Profiler::~Profiler() = default;

void Profiler::set_device(Device device) {
  device_ = device;
#if PRECIS_WITH_CUDA
  if (device.is_cuda()) gpu_ = std::make_unique<GpuEvents>(device);
#endif
}

void Profiler::begin(const char* name, Stream stream) {
  open_.push_back({name, Clock::now()});
#if PRECIS_WITH_CUDA
  if (gpu_) gpu_->begin(name, stream == Stream::communication);
#endif
}

void Profiler::end() {
  PRECIS_CHECK(!open_.empty(), "Profiler::end without a matching begin");
  Open phase = std::move(open_.back());
  open_.pop_back();
  if (recording_spans_) spans_.push_back({phase.name, phase.start, Clock::now()});
#if PRECIS_WITH_CUDA
  if (gpu_) {
    gpu_->end();
    return;
  }
#endif
  add(phase.name, std::chrono::duration<double, std::milli>(Clock::now() - phase.start).count());
}

void Profiler::add(const std::string& name, double ms) {
  for (auto& [existing, total] : totals_) {
    if (existing == name) {
      total += ms;
      return;
    }
  }
  totals_.emplace_back(name, ms);
}

std::vector<Profiler::Span> Profiler::take_spans() {
  std::vector<Span> out = std::move(spans_);
  spans_.clear();
  return out;
}

void Profiler::begin_graph_capture() {
#if PRECIS_WITH_CUDA
  if (gpu_) gpu_->set_capturing(true);
#endif
  graph_phases_ = false;
}

void Profiler::end_graph_capture() {
#if PRECIS_WITH_CUDA
  if (gpu_) gpu_->set_capturing(false);
#endif
}

void Profiler::keep_graph_phases(const std::function<bool(void*)>& in_graph) {
#if PRECIS_WITH_CUDA
  if (gpu_) {
    gpu_->keep_captured(in_graph);
    graph_phases_ = !gpu_->replay_events_empty();
  }
#endif
  (void)in_graph;
}

std::vector<std::pair<void*, void*>> Profiler::graph_replay_events() {
#if PRECIS_WITH_CUDA
  if (gpu_) return gpu_->replay_events();
#endif
  return {};
}

std::vector<std::pair<std::string, double>> Profiler::take_ms() {
#if PRECIS_WITH_CUDA
  if (gpu_)
    for (auto& [name, ms] : gpu_->resolve()) add(name, ms);
#endif
  auto out = std::move(totals_);
  totals_.clear();
  return out;
}

}  // namespace precis
