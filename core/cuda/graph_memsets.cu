// hoist_memsets and the capture arena whose slices make it safe (core/cuda/graph_memsets.h).
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

constexpr size_t kArenaBytes = size_t(64) << 20;
constexpr size_t kMaxSliceBytes = size_t(1) << 20;  // a counter needs little; large workspaces go the usual way
constexpr size_t kSliceAlignment = 256;

std::atomic<bool> g_on{true};                               // set_memset_hoisting
std::mutex g_ranges_mutex;                                  // guards everything below
std::vector<std::pair<const char*, const char*>> g_ranges;  // the slices of the capture under way: [begin, end)

// A device's capture arena and the capture its slices were handed out to.
struct Arena {
  char* base = nullptr;
  size_t used = 0;
  unsigned long long capture = 0;
};
std::map<int, Arena> g_arenas;

// The registered range holding [begin, end), or -1.
int range_of(const char* begin, const char* end) {
  std::lock_guard<std::mutex> lock(g_ranges_mutex);
  for (size_t r = 0; r < g_ranges.size(); ++r)
    if (begin >= g_ranges[r].first && end <= g_ranges[r].second) return static_cast<int>(r);
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
  int range;  // the registered range holding it, or -1
};

}  // namespace

bool memset_hoisting() { return g_on.load(); }

void set_memset_hoisting(bool on) { g_on = on; }

void prepare_capture_arena(Device device) {
  if (!memset_hoisting()) return;
  std::lock_guard<std::mutex> lock(g_ranges_mutex);
  Arena& arena = g_arenas[device.index];
  if (arena.base != nullptr || any_capture_underway()) return;
  arena.base = static_cast<char*>(allocator_for(device).allocate(kArenaBytes));
}

void* capture_workspace(Device device, cudaStream_t stream, size_t bytes) {
  if (!memset_hoisting() || bytes == 0 || bytes > kMaxSliceBytes) return nullptr;
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  unsigned long long id = 0;
  PRECIS_CUDA_CHECK(cudaStreamGetCaptureInfo(stream, &status, &id), "a captured call's workspace slice");
  if (status != cudaStreamCaptureStatusActive) return nullptr;
  std::lock_guard<std::mutex> lock(g_ranges_mutex);
  Arena& arena = g_arenas[device.index];
  if (arena.base == nullptr) return nullptr;
  if (id != arena.capture) {  // a new capture: its slices from the arena's start
    arena.capture = id;
    arena.used = 0;
    g_ranges.clear();
  }
  const size_t rounded = (bytes + kSliceAlignment - 1) / kSliceAlignment * kSliceAlignment;
  if (arena.used + rounded > kArenaBytes) return nullptr;
  char* slice = arena.base + arena.used;
  arena.used += rounded;
  g_ranges.emplace_back(slice, slice + rounded);
  return slice;
}

size_t hoist_memsets(cudaGraph_t graph) {
  const char* op = "hoisting memset nodes";
  if (!memset_hoisting()) return 0;
  size_t count = 0;
  PRECIS_CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &count), op);
  std::vector<cudaGraphNode_t> nodes(count);
  PRECIS_CUDA_CHECK(cudaGraphGetNodes(graph, nodes.data(), &count), op);

  // Every zeroing memset node's target; those alone in a registered range, overlapping no
  // other target, are hoisted.
  std::vector<Target> all, hoisted;
  for (cudaGraphNode_t node : nodes) {
    if (type_of(node) != cudaGraphNodeTypeMemset) continue;
    cudaMemsetParams m{};
    PRECIS_CUDA_CHECK(cudaGraphMemsetNodeGetParams(node, &m), op);
    const char* begin = static_cast<const char*>(m.dst);
    const size_t rows = m.height > 0 ? m.height : 1;
    const size_t row_bytes = m.width * m.elementSize;
    const char* end = begin + (rows - 1) * (rows > 1 ? m.pitch : 0) + row_bytes;
    all.push_back({node, begin, end, m.value == 0 ? range_of(begin, end) : -1});  // only zeroing moves
  }
  std::sort(all.begin(), all.end(), [](const Target& a, const Target& b) { return a.begin < b.begin; });
  std::vector<int> per_range;  // memset targets in each registered range
  for (const Target& t : all)
    if (t.range >= 0) {
      if (per_range.size() <= static_cast<size_t>(t.range)) per_range.resize(t.range + 1, 0);
      ++per_range[t.range];
    }
  for (size_t i = 0; i < all.size(); ++i) {
    const bool overlaps_previous = i > 0 && all[i].begin < all[i - 1].end;
    const bool overlaps_next = i + 1 < all.size() && all[i + 1].begin < all[i].end;
    if (all[i].range >= 0 && per_range[all[i].range] == 1 && !overlaps_previous && !overlaps_next)
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
  const char* span_begin = hoisted.front().begin;
  const char* span_end = hoisted.front().end;
  for (const Target& t : hoisted) {
    span_begin = std::min(span_begin, t.begin);
    span_end = std::max(span_end, t.end);
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
  // One zeroing node before the graph's first nodes.
  std::vector<cudaGraphNode_t> roots;
  PRECIS_CUDA_CHECK(cudaGraphGetRootNodes(graph, nullptr, &count), op);
  roots.resize(count);
  PRECIS_CUDA_CHECK(cudaGraphGetRootNodes(graph, roots.data(), &count), op);
  cudaMemsetParams zero{};
  zero.dst = const_cast<char*>(span_begin);
  zero.value = 0;
  zero.elementSize = 1;
  zero.width = static_cast<size_t>(span_end - span_begin);
  zero.height = 1;
  cudaGraphNode_t start = nullptr;
  PRECIS_CUDA_CHECK(cudaGraphAddMemsetNode(&start, graph, nullptr, 0, &zero), op);
  for (cudaGraphNode_t root : roots) PRECIS_CUDA_CHECK(cudaGraphAddDependencies(graph, &start, &root, nullptr, 1), op);
  return hoisted.size();
}

}  // namespace precis::cuda
