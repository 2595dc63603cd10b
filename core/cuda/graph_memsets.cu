// hoist_memsets and the workspace slices that make it safe (core/cuda/graph_memsets.h).
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "core/allocator.h"
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

// The workspace slices handed out in each capture, by its id, until the graph is released.
struct Slice {
  char* begin;
  size_t bytes;
  Device device;
};
std::mutex g_slices_mutex;  // guards g_slices
std::map<unsigned long long, std::vector<Slice>> g_slices;

// The index of capture `capture`'s slice holding [begin, end), or -1.
int slice_of(unsigned long long capture, const char* begin, const char* end) {
  std::lock_guard<std::mutex> lock(g_slices_mutex);
  const auto it = g_slices.find(capture);
  if (it == g_slices.end()) return -1;
  for (size_t r = 0; r < it->second.size(); ++r) {
    const Slice& slice = it->second[r];
    if (begin >= slice.begin && end <= slice.begin + slice.bytes) return static_cast<int>(r);
  }
  return -1;
}

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

struct Target {
  cudaGraphNode_t node;
  const char* begin;
  const char* end;
  int slice;  // the index of the capture's slice holding it, or -1
};

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

void* capture_workspace(Device device, cudaStream_t stream, size_t bytes) {
  if (!memset_hoisting() || bytes == 0 || bytes > kMaxSliceBytes) return nullptr;
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  unsigned long long capture = 0;
  PRECIS_CUDA_CHECK(cudaStreamGetCaptureInfo(stream, &status, &capture), "a captured call's workspace slice");
  if (status != cudaStreamCaptureStatusActive) return nullptr;
  // Taken during the capture, the block belongs to the capture's private pool (core/cuda/allocator.cu),
  // and it is not freed before the graph is: no other node of the graph reuses its bytes.
  const size_t rounded = (bytes + kSliceAlignment - 1) / kSliceAlignment * kSliceAlignment;
  char* begin = static_cast<char*>(allocator_for(device).allocate(rounded));
  std::lock_guard<std::mutex> lock(g_slices_mutex);
  g_slices[capture].push_back({begin, rounded, device});
  return begin;
}

void release_capture_workspaces(unsigned long long capture) {
  std::vector<Slice> slices;
  {
    std::lock_guard<std::mutex> lock(g_slices_mutex);
    const auto it = g_slices.find(capture);
    if (it == g_slices.end()) return;
    slices = std::move(it->second);
    g_slices.erase(it);
  }
  for (const Slice& slice : slices) allocator_for(slice.device).deallocate(slice.begin, slice.bytes);
}

size_t hoist_memsets(cudaGraph_t graph, unsigned long long capture) {
  const char* op = "hoisting memset nodes";
  if (!memset_hoisting()) return 0;
  size_t count = 0;
  PRECIS_CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &count), op);
  std::vector<cudaGraphNode_t> nodes(count);
  PRECIS_CUDA_CHECK(cudaGraphGetNodes(graph, nodes.data(), &count), op);

  // Every zeroing memset node's target; those alone in a slice, overlapping no other target,
  // are hoisted.
  std::vector<Target> all, hoisted;
  for (cudaGraphNode_t node : nodes) {
    if (type_of(node) != cudaGraphNodeTypeMemset) continue;
    cudaMemsetParams m{};
    PRECIS_CUDA_CHECK(cudaGraphMemsetNodeGetParams(node, &m), op);
    const char* begin = static_cast<const char*>(m.dst);
    const size_t rows = m.height > 0 ? m.height : 1;
    const size_t row_bytes = m.width * m.elementSize;
    const char* end = begin + (rows - 1) * (rows > 1 ? m.pitch : 0) + row_bytes;
    all.push_back({node, begin, end, m.value == 0 ? slice_of(capture, begin, end) : -1});  // only zeroing moves
  }
  std::sort(all.begin(), all.end(), [](const Target& a, const Target& b) { return a.begin < b.begin; });
  std::vector<int> per_slice;  // memset targets in each slice
  for (const Target& t : all)
    if (t.slice >= 0) {
      if (per_slice.size() <= static_cast<size_t>(t.slice)) per_slice.resize(t.slice + 1, 0);
      ++per_slice[t.slice];
    }
  for (size_t i = 0; i < all.size(); ++i) {
    const bool overlaps_previous = i > 0 && all[i].begin < all[i - 1].end;
    const bool overlaps_next = i + 1 < all.size() && all[i + 1].begin < all[i].end;
    if (all[i].slice >= 0 && per_slice[all[i].slice] == 1 && !overlaps_previous && !overlaps_next &&
        hoisted.size() < kMaxZeroTargets)
      hoisted.push_back(all[i]);
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
    zero.begin[zero.count] = const_cast<char*>(t.begin);
    zero.bytes[zero.count++] = static_cast<unsigned>(t.end - t.begin);  // a pitched target's gaps too: all its slice's
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
