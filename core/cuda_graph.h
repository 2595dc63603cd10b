// CudaGraph: the work a function queues on a GPU's compute stream, recorded once
// into a CUDA graph (stream capture) and then replayed with one launch.
//
// Capture runs nothing: the function's kernels, copies and memsets become nodes
// of the graph, with the addresses they were given. So everything the work reads
// or writes must stay where it is for as long as the graph is replayed (static
// input buffers, parameters, optimizer state, device scalars), values that
// change from step to step must be read from device memory (never baked in as
// kernel arguments), and the work must not synchronise with the host, read a
// value back, or free memory to CUDA (core/cuda/allocator.cu serves requests
// during a capture from its cache, into the capture's private pool, and takes a
// new segment only on a miss; run the work eagerly once or twice first so the
// cache holds the sizes it needs).
//
// Without a CUDA build capture() raises precis::Error.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "core/device.h"

namespace precis {

class CudaGraph {
 public:
  explicit CudaGraph(Device device);
  // Destroys the graph; the memory it held returns to the allocator's general cache.
  ~CudaGraph();
  CudaGraph(const CudaGraph&) = delete;
  CudaGraph& operator=(const CudaGraph&) = delete;

  // Records what `work` queues on the compute stream (replacing an earlier graph), then
  // removes the edges its other edges imply (core/cuda/graph_edges.h). If `work` throws,
  // or the capture is invalidated by something it did, the capture is abandoned (the
  // stream is usable again, its memory freed) and precis::Error says why.
  void capture(const std::function<void()>& work);
  // Queues one run of the graph on the compute stream (returns at once). Each (captured,
  // fresh) pair of `event_swaps` first points the event record node that records `captured`
  // (cudaEventRecordExternal during the capture) at `fresh`: every replay records its own
  // events, so the phases of each replay can be timed (core/profiler.h).
  void replay(const std::vector<std::pair<void*, void*>>& event_swaps = {});
  // Whether the captured graph has an event record node for `event` (a cudaEvent_t).
  bool has_event_node(void* event) const;
  bool captured() const;
  // Nodes (kernels, copies, memsets) in the captured graph.
  size_t num_nodes() const;
  // Nodes of the captured graph that more than one node depends on: 0 when the work was one
  // stream's, in order (a chain); a fork to another stream adds one, and a fork made again
  // after a join two (both streams' last nodes lead into both streams' next ones). A graph with
  // forks replays slower, kernel for kernel, than a chain (bench/NOTES.md, eleventh session).
  size_t num_forks() const;
  // Memset nodes in the captured graph, and of those the capture removed from its chain
  // (core/cuda/graph_memsets.h).
  size_t num_memset_nodes() const;
  size_t num_hoisted_memsets() const;

 private:
  struct State;  // the CUDA handles (core/cuda/cuda_graph.cu)
  Device device_;
  std::unique_ptr<State> state_;
};

}  // namespace precis
