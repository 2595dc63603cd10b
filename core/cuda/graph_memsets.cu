// hoist_memsets and the workspace slices that make it safe (core/cuda/graph_memsets.h).
#include <atomic>
#include <cstdlib>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "core/cuda/caching_allocator.h"
#include "core/cuda/cuda_check.h"
#include "core/cuda/graph_memsets.h"
#include "core/cuda/launch.cuh"
#include "core/cuda/runtime.h"
#include "core/error.h"

namespace precis::cuda {

namespace {

constexpr size_t kMaxSliceBytes = size_t(1) << 20;  // a counter needs little; large workspaces go the usual way
constexpr size_t kSliceAlignment = 256;

std::atomic<bool> g_on{true};  // set_memset_hoisting

// What each capture noted: the memset nodes each call aimed into its slice.
constexpr int kUnknown = 1 << 30;  // a slice's memset count when a query failed: none of them moves
struct CaptureNotes {
  std::set<cudaGraphNode_t> seen;           // nodes already looked at by a call's end
  std::map<cudaGraphNode_t, int> slice_of;  // a noted memset -> the slice (call) it belongs to
  std::vector<int> memsets_per_slice;       // by slice
};
std::mutex g_notes_mutex;  // guards g_notes
std::map<unsigned long long, CaptureNotes> g_notes;

cudaGraphNodeType type_of(cudaGraphNode_t node) {
  cudaGraphNodeType type;
  if (cudaGraphNodeGetType(node, &type) != cudaSuccess) {
    cudaGetLastError();  // a node the runtime cannot name (core/cuda/cuda_graph.cu)
    return cudaGraphNodeTypeCount;
  }
  return type;
}

// A node's neighbours over its incoming (or outgoing) edges, each with its edge data (asking
// without it fails once a graph holds programmatic edges: cudaErrorLossyQuery).
struct Neighbour {
  cudaGraphNode_t node;
  cudaGraphEdgeData edge;
};
std::vector<Neighbour> neighbours(cudaGraphNode_t node, bool incoming, const char* op) {
  size_t count = 0;
  auto query = [&](cudaGraphNode_t* nodes, cudaGraphEdgeData* edges) {
    return incoming ? cudaGraphNodeGetDependencies(node, nodes, edges, &count)
                    : cudaGraphNodeGetDependentNodes(node, nodes, edges, &count);
  };
  PRECIS_CUDA_CHECK(query(nullptr, nullptr), op);
  std::vector<cudaGraphNode_t> nodes(count);
  std::vector<cudaGraphEdgeData> edges(count);
  PRECIS_CUDA_CHECK(query(nodes.data(), edges.data()), op);
  std::vector<Neighbour> out;
  for (size_t i = 0; i < count; ++i) out.push_back({nodes[i], edges[i]});
  return out;
}

// The function a kernel node runs (null for another node).
const void* function_of(cudaGraphNode_t node) {
  if (type_of(node) != cudaGraphNodeTypeKernel) return nullptr;
  cudaKernelNodeParams params{};
  if (cudaGraphKernelNodeGetParams(node, &params) != cudaSuccess) {
    cudaGetLastError();
    return nullptr;
  }
  return params.func;
}

// The bytes a memset node sets (a pitched target's gaps included).
struct Target {
  cudaGraphNode_t node;
  char* begin;
  size_t bytes;
  unsigned value;
};
size_t bytes_set(const cudaMemsetParams& m) {
  const size_t rows = m.height > 0 ? m.height : 1;
  return (rows - 1) * (rows > 1 ? m.pitch : 0) + m.width * m.elementSize;
}
Target target_of(cudaGraphNode_t node, const char* op) {
  cudaMemsetParams m{};
  PRECIS_CUDA_CHECK(cudaGraphMemsetNodeGetParams(node, &m), op);
  return {node, static_cast<char*>(m.dst), bytes_set(m), m.value};
}

// The zeroing node at a graph's start: each of its blocks zeroes targets, a byte a thread at a
// time (the targets are cuBLASLt's and cuDNN's counters: 4 bytes to a few KiB each).
constexpr int kMaxZeroTargets = 255;  // the parameters within the classic 4 KiB
struct ZeroTargets {
  char* begin[kMaxZeroTargets];
  unsigned bytes[kMaxZeroTargets];
  int count;
};
__global__ void zero_targets_kernel(const __grid_constant__ ZeroTargets targets) {
  wait_for_previous_grid();
  allow_next_grid_to_start();
  for (int t = blockIdx.x; t < targets.count; t += gridDim.x)
    for (unsigned i = threadIdx.x; i < targets.bytes[t]; i += blockDim.x) targets.begin[t][i] = 0;
}

}  // namespace

bool memset_hoisting() { return g_on.load(); }

void set_memset_hoisting(bool on) { g_on = on; }

CaptureWorkspace::CaptureWorkspace(Device device, cudaStream_t stream, size_t bytes)
    : device_(device), stream_(stream) {
  if (!memset_hoisting() || bytes == 0 || bytes > kMaxSliceBytes) return;
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  PRECIS_CUDA_CHECK(cudaStreamGetCaptureInfo(stream, &status, &capture_), "a captured call's workspace slice");
  if (status != cudaStreamCaptureStatusActive) return;
  bytes_ = (bytes + kSliceAlignment - 1) / kSliceAlignment * kSliceAlignment;
  begin_ = static_cast<char*>(caching_allocator(device).allocate_unused_by_capture(bytes_, stream));
}

// Notes the memsets the call aimed into the slice, then frees it. A failed query leaves the
// slice poisoned (a count no memset is hoisted with): hoisting is only an optimization.
CaptureWorkspace::~CaptureWorkspace() {
  if (begin_ == nullptr) return;
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  cudaGraph_t graph = nullptr;
  std::vector<cudaGraphNode_t> nodes;
  size_t count = 0;
  bool ok = cudaStreamGetCaptureInfo(stream_, &status, nullptr, &graph) == cudaSuccess &&
            status == cudaStreamCaptureStatusActive && cudaGraphGetNodes(graph, nullptr, &count) == cudaSuccess;
  if (ok) {
    nodes.resize(count);
    ok = cudaGraphGetNodes(graph, nodes.data(), &count) == cudaSuccess;
  }
  if (!ok) cudaGetLastError();
  {
    std::lock_guard<std::mutex> lock(g_notes_mutex);
    CaptureNotes& notes = g_notes[capture_];
    const int slice = static_cast<int>(notes.memsets_per_slice.size());
    notes.memsets_per_slice.push_back(ok ? 0 : kUnknown);
    for (cudaGraphNode_t node : nodes) {
      if (!notes.seen.insert(node).second || type_of(node) != cudaGraphNodeTypeMemset) continue;
      cudaMemsetParams m{};
      if (cudaGraphMemsetNodeGetParams(node, &m) != cudaSuccess) {
        cudaGetLastError();
        notes.memsets_per_slice[slice] = kUnknown;
        continue;
      }
      const char* dst = static_cast<const char*>(m.dst);
      if (dst < begin_ || dst >= begin_ + bytes_) continue;  // another call's memset, or a tensor's
      if (dst + bytes_set(m) > begin_ + bytes_) {
        notes.memsets_per_slice[slice] = kUnknown;  // reaching past the slice: it stays where it is
        continue;
      }
      notes.slice_of[node] = slice;
      ++notes.memsets_per_slice[slice];
    }
  }
  caching_allocator(device_).deallocate(begin_, bytes_);
}

void forget_capture_memsets(unsigned long long capture) {
  std::lock_guard<std::mutex> lock(g_notes_mutex);
  g_notes.erase(capture);
}

size_t hoist_memsets(cudaGraph_t graph, unsigned long long capture) {
  const char* op = "hoisting memset nodes";
  if (!memset_hoisting()) return 0;
  // The memsets that zero the slice of a call that queued no other.
  std::vector<Target> hoisted;
  {
    std::lock_guard<std::mutex> lock(g_notes_mutex);
    const auto it = g_notes.find(capture);
    if (it == g_notes.end()) return 0;
    for (const auto& [node, slice] : it->second.slice_of) {
      if (it->second.memsets_per_slice[slice] != 1 || hoisted.size() == size_t(kMaxZeroTargets)) continue;
      const Target t = target_of(node, op);
      if (t.value == 0) hoisted.push_back(t);
    }
  }
  if (hoisted.empty()) return 0;

  // Each removed node's successors take its predecessors; the edge between two kernels is
  // programmatic when the successor's function waits (graph_memsets.h).
  std::set<std::pair<cudaGraphNode_t, cudaGraphNode_t>> edges;
  std::set<const void*> waiting_functions;
  {
    size_t num_edges = 0;
    PRECIS_CUDA_CHECK(cudaGraphGetEdges(graph, nullptr, nullptr, nullptr, &num_edges), op);
    std::vector<cudaGraphNode_t> from(num_edges), to(num_edges);
    std::vector<cudaGraphEdgeData> data(num_edges);
    PRECIS_CUDA_CHECK(cudaGraphGetEdges(graph, from.data(), to.data(), data.data(), &num_edges), op);
    for (size_t e = 0; e < num_edges; ++e) {
      edges.emplace(from[e], to[e]);
      const void* function = function_of(to[e]);
      if (data[e].type == cudaGraphDependencyTypeProgrammatic && function != nullptr)
        waiting_functions.insert(function);
    }
  }
  const bool dependent_launch = dependent_launch_enabled();
  ZeroTargets zero{};
  for (const Target& t : hoisted) {
    zero.begin[zero.count] = t.begin;
    zero.bytes[zero.count++] = static_cast<unsigned>(t.bytes);  // within its slice: at most 1 MiB
    const std::vector<Neighbour> before = neighbours(t.node, true, op);
    const std::vector<Neighbour> after = neighbours(t.node, false, op);
    PRECIS_CUDA_CHECK(cudaGraphDestroyNode(t.node), op);
    for (const Neighbour& p : before)
      for (const Neighbour& s : after) {
        if (!edges.emplace(p.node, s.node).second) continue;  // already ordered directly
        cudaGraphEdgeData data{};
        data.from_port = p.edge.from_port;  // a launch-completion edge into the memset stays one
        if (dependent_launch && p.edge.from_port == cudaGraphKernelNodePortDefault &&
            type_of(p.node) == cudaGraphNodeTypeKernel && type_of(s.node) == cudaGraphNodeTypeKernel &&
            waiting_functions.count(function_of(s.node)) > 0) {
          data.from_port = cudaGraphKernelNodePortProgrammatic;
          data.type = cudaGraphDependencyTypeProgrammatic;
        }
        PRECIS_CUDA_CHECK(cudaGraphAddDependencies(graph, &p.node, &s.node, &data, 1), op);
      }
  }
  // One zeroing kernel before the graph's first nodes (the targets lie apart, each in its slice).
  std::vector<cudaGraphNode_t> roots;
  size_t count = 0;
  PRECIS_CUDA_CHECK(cudaGraphGetRootNodes(graph, nullptr, &count), op);
  roots.resize(count);
  PRECIS_CUDA_CHECK(cudaGraphGetRootNodes(graph, roots.data(), &count), op);
  void* arguments[] = {&zero};
  cudaKernelNodeParams params{};
  params.func = reinterpret_cast<void*>(zero_targets_kernel);
  params.gridDim = dim3(static_cast<unsigned>(zero.count));
  params.blockDim = dim3(128);
  params.kernelParams = arguments;
  cudaGraphNode_t start = nullptr;
  PRECIS_CUDA_CHECK(cudaGraphAddKernelNode(&start, graph, nullptr, 0, &params), op);
  for (cudaGraphNode_t root : roots) PRECIS_CUDA_CHECK(cudaGraphAddDependencies(graph, &start, &root, nullptr, 1), op);
  return hoisted.size();
}

}  // namespace precis::cuda
