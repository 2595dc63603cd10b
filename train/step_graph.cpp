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
    Profiler::Phase phase(profiler, "graph");
    graph_->replay();
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
    graph->capture([&] { step(nullptr); });
  } catch (const std::exception& e) {
    // Nothing of the step ran (a capture only records): run it eagerly, and every step after.
    use_ = false;
    std::cerr << "note: cuda_graphs: not used: " << e.what() << "; the step runs eagerly\n";
    step(&profiler);
    return;
  }
  ops::autocast::clear_cache();  // the casts made during the capture are the graph's
  graph_ = std::move(graph);
  std::cout << "cuda graphs: captured the training step (" << graph_->num_nodes() << " nodes) after " << eager_steps_
            << " eager steps; replaying it from now on" << std::endl;
  Profiler::Phase phase(profiler, "graph");
  graph_->replay();
}

}  // namespace precis::train
