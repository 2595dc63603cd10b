#include "train/step_graph.h"

#include <iostream>

#include "ops/autocast.h"

namespace precis::train {

StepGraph::StepGraph(Device device, bool requested, const std::string& not_possible, bool report_steps)
    : device_(device), use_(requested && not_possible.empty()) {
  if (!requested) return;
  if (!use_) {
    std::cerr << "note: cuda_graphs: not used: " << not_possible << "; the step runs eagerly\n";
    return;
  }
  if (report_steps)
    std::cerr << "note: cuda_graphs: numerics report steps run eagerly (the report reads tensors on the host); "
                 "the other steps replay the graph\n";
}

void StepGraph::run(const std::function<void(Profiler*)>& step, Profiler& profiler, bool eager) {
  if (graph_ && !eager) {
    replay(profiler);
  } else if (use_ && !graph_ && !eager && eager_steps_ >= kWarmupSteps) {
    capture_and_replay(step, profiler);
  } else {
    step(&profiler);
    ++eager_steps_;
  }
}

void StepGraph::capture_and_replay(const std::function<void(Profiler*)>& step, Profiler& profiler) {
  auto graph = std::make_unique<CudaGraph>(device_);
  try {
    graph->capture([&] {
      profiler.begin_graph_capture();
      try {
        step(&profiler);
      } catch (...) {
        profiler.end_graph_capture();
        throw;
      }
      profiler.end_graph_capture();
    });
  } catch (const std::exception& e) {
    // Nothing of the step ran (a capture only records): run it eagerly, and every step after.
    use_ = false;
    std::cerr << "note: cuda_graphs: not used: " << e.what() << "; the step runs eagerly\n";
    step(&profiler);
    return;
  }
  ops::autocast::clear_cache();  // the casts made during the capture are the graph's
  graph_ = std::move(graph);
  // Phases recorded on a stream outside the capture have no node to time them.
  profiler.keep_graph_phases([this](void* event) { return graph_->has_event_node(event); });
  const size_t forks = graph_->num_forks();
  const size_t hoisted = graph_->num_hoisted_memsets();
  // Memsets still between kernels (each a few microseconds of gaps: core/cuda/graph_memsets.h).
  const size_t left = graph_->num_memset_nodes();
  std::cout << "cuda graphs: captured the training step (" << graph_->num_nodes() << " nodes, "
            << (forks == 0 ? std::string("one stream") : std::to_string(forks) + " forks to other streams")
            << (hoisted > 0 ? ", " + std::to_string(hoisted) + " memsets moved to its start" : std::string())
            << (left > 0 ? ", " + std::to_string(left) + " memsets left between kernels" : std::string()) << ") after "
            << eager_steps_ << " eager steps; replaying it from now on"
            << (profiler.graph_has_phases() ? ", its phases timed by event nodes in the graph" : "") << std::endl;
  replay(profiler);
}

void StepGraph::replay(Profiler& profiler) {
  if (profiler.graph_has_phases()) {
    graph_->replay(profiler.graph_replay_events());
  } else {
    Profiler::Phase phase(profiler, "graph");
    graph_->replay();
  }
}

}  // namespace precis::train
