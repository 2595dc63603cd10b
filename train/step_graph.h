// StepGraph: the training step captured into a CUDA graph and replayed
// (`cuda_graphs: true`).
//
// Every per-step value of the step comes from device memory (the batches' fixed
// buffers, the learning rate, the step count, the loss scaler's state), so a step
// is the same sequence of kernels every time. After kWarmupSteps eager steps
// (which fill the allocator's cache, pick the matmul algorithms and create the
// optimizer state) one step is captured into a CudaGraph (core/cuda_graph.h) and
// replayed from then on. Steps asked to run eagerly (numerics report steps, which
// read tensors on the host) run eagerly between replays. When the step cannot be
// captured (the reason given at construction, or the capture failing) the run
// says why in one line and stays eager. On a CPU run every step is eager.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "core/cuda_graph.h"
#include "core/device.h"
#include "core/profiler.h"

namespace precis::train {

class StepGraph {
 public:
  static constexpr int64_t kWarmupSteps = 3;

  // `requested`: cuda_graphs is on; `not_possible`: why the step cannot be captured, or empty.
  // Prints a note when a requested graph is not used, or when `report_steps` run eagerly.
  StepGraph(Device device, bool requested, const std::string& not_possible, bool report_steps);

  // One step: `step(profiler)` eagerly (warm-up, `eager`, or no graph; timed by its
  // phases), or the captured graph. The first step after the warm-up is captured with its
  // phases' events as event record nodes of the graph (core/profiler.h), so a replayed step
  // keeps its phases (forward, backward, optimizer, communication); a graph without them is
  // timed as one "graph" phase. A capture that fails runs the step eagerly, as every later one.
  void run(const std::function<void(Profiler*)>& step, Profiler& profiler, bool eager);
  bool replaying() const { return graph_ != nullptr; }

 private:
  void capture_and_replay(const std::function<void(Profiler*)>& step, Profiler& profiler);
  void replay(Profiler& profiler);

  Device device_;
  bool use_ = false;
  int64_t eager_steps_ = 0;
  std::unique_ptr<CudaGraph> graph_;
};

}  // namespace precis::train
