// CudaGraph on the CUDA runtime (core/cuda_graph.h says what it is for).
//
// The capture runs in the global mode: while it is underway, a call anywhere in
// the process that is unsafe during a capture (a sync, cudaMalloc, an event query)
// fails instead of silently breaking the graph. The allocator's blocks taken
// during the capture form its private pool (core/cuda/allocator.cu), given back
// with release_graph_pool when the graph is destroyed or the capture abandoned.
#include <algorithm>
#include <string>
#include <vector>

#include "core/cuda/caching_allocator.h"
#include "core/cuda/graph_edges.h"
#include "core/cuda/graph_memsets.h"
#include "core/cuda/runtime.h"
#include "core/cuda_graph.h"

namespace precis {

struct CudaGraph::State {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  unsigned long long capture_id = 0;  // names the allocator's private pool; 0: none
  size_t nodes = 0;
  size_t forks = 0;                                                  // nodes with more than one dependent
  size_t memsets = 0;                                                // memset nodes
  size_t hoisted = 0;                                                // memset nodes hoisted (graph_memsets.h)
  std::vector<std::pair<cudaEvent_t, cudaGraphNode_t>> event_nodes;  // the event record nodes

  void reset(Device device) {
    if (exec != nullptr) cudaGraphExecDestroy(exec);
    if (graph != nullptr) cudaGraphDestroy(graph);
    if (capture_id != 0) {
      cuda::forget_capture_memsets(capture_id);  // graph_memsets.h
      cuda::caching_allocator(device).release_graph_pool(capture_id);
    }
    *this = State{};
  }
};

CudaGraph::CudaGraph(Device device) : device_(device), state_(std::make_unique<State>()) {
  PRECIS_CHECK(device.is_cuda(), "CudaGraph: CUDA graphs need a GPU, got ", device);
}

CudaGraph::~CudaGraph() {
  cuda::DeviceGuard guard(device_);
  state_->reset(device_);
}

void CudaGraph::capture(const std::function<void()>& work) {
  const char* op = "CUDA graph capture";
  cuda::DeviceGuard guard(device_);
  state_->reset(device_);
  cudaStream_t stream = cuda::compute_stream(device_);
  PRECIS_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), op);
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  PRECIS_CUDA_CHECK(cudaStreamGetCaptureInfo(stream, &status, &state_->capture_id), op);
  std::string failure;
  try {
    work();
  } catch (const std::exception& e) {
    failure = e.what();
  } catch (...) {
    failure = "an unknown exception";
  }
  // The capture must end whatever happened, so that the stream takes work again.
  cudaGraph_t graph = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(stream, &graph);
  if (failure.empty() && ended != cudaSuccess)
    failure = std::string("the capture was invalidated (") + cudaGetErrorName(ended) +
              "): the work did something a graph cannot hold, such as a host sync or a pageable copy";
  state_->graph = graph;
  if (failure.empty()) {
    try {
      state_->hoisted = cuda::hoist_memsets(graph, state_->capture_id);
      cuda::remove_implied_edges(graph);
    } catch (const std::exception& e) {
      failure = e.what();
    }
  }
  if (failure.empty()) {
    const cudaError_t made = cudaGraphInstantiate(&state_->exec, graph, 0);
    if (made != cudaSuccess) failure = std::string("instantiating the graph failed (") + cudaGetErrorName(made) + ")";
  }
  if (!failure.empty()) {
    cudaGetLastError();  // a failed capture is an answer, not a broken context: clear it
    state_->reset(device_);
    PRECIS_FAIL(op, " failed: ", failure);
  }
  PRECIS_CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &state_->nodes), op);
  std::vector<cudaGraphNode_t> nodes(state_->nodes);
  PRECIS_CUDA_CHECK(cudaGraphGetNodes(graph, nodes.data(), &state_->nodes), op);
  for (cudaGraphNode_t node : nodes) {
    size_t dependents = 0;
    PRECIS_CUDA_CHECK(cudaGraphNodeGetDependentNodes(node, nullptr, nullptr, &dependents), op);
    if (dependents > 1) ++state_->forks;
    cudaGraphNodeType type;
    // The runtime has no name for some driver-made nodes (NCCL's copy-engine all-gather
    // captures stream memory operations) and answers cudaErrorUnknown, left as the last error:
    // such a node records no event of ours, so clear the error and skip it.
    if (cudaGraphNodeGetType(node, &type) != cudaSuccess) {
      cudaGetLastError();
      continue;
    }
    if (type == cudaGraphNodeTypeMemset) ++state_->memsets;
    if (type != cudaGraphNodeTypeEventRecord) continue;
    cudaEvent_t event = nullptr;
    PRECIS_CUDA_CHECK(cudaGraphEventRecordNodeGetEvent(node, &event), op);
    state_->event_nodes.emplace_back(event, node);
  }
}

void CudaGraph::replay(const std::vector<std::pair<void*, void*>>& event_swaps) {
  PRECIS_CHECK(captured(), "CudaGraph::replay: nothing has been captured");
  cuda::DeviceGuard guard(device_);
  for (const auto& [captured_event, fresh] : event_swaps) {
    auto node = std::find_if(state_->event_nodes.begin(), state_->event_nodes.end(),
                             [e = captured_event](const auto& n) { return n.first == static_cast<cudaEvent_t>(e); });
    PRECIS_CHECK(node != state_->event_nodes.end(), "CudaGraph::replay: the graph has no node recording that event");
    PRECIS_CUDA_CHECK(cudaGraphExecEventRecordNodeSetEvent(state_->exec, node->second, static_cast<cudaEvent_t>(fresh)),
                      "CUDA graph replay");
  }
  PRECIS_CUDA_CHECK(cudaGraphLaunch(state_->exec, cuda::compute_stream(device_)), "CUDA graph replay");
}

bool CudaGraph::has_event_node(void* event) const {
  for (const auto& node : state_->event_nodes)
    if (node.first == static_cast<cudaEvent_t>(event)) return true;
  return false;
}

bool CudaGraph::captured() const { return state_->exec != nullptr; }

size_t CudaGraph::num_nodes() const { return state_->nodes; }

size_t CudaGraph::num_forks() const { return state_->forks; }

size_t CudaGraph::num_memset_nodes() const { return state_->memsets; }

size_t CudaGraph::num_hoisted_memsets() const { return state_->hoisted; }

}  // namespace precis
