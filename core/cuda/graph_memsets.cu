// replace_small_memsets (core/cuda/graph_memsets.h).
//
// A memset node sets `height` rows of `width` elements of `elementSize` bytes (1, 2 or 4), the
// rows `pitch` bytes apart, to `value` (its low bytes). fill_rows does the same, one element a
// thread, grid-stride: for element i, row = i / width, column = i % width,
//   ((T*)(dst + row * pitch))[column] = value.
#include <algorithm>
#include <vector>

#include "core/cuda/cuda_check.h"
#include "core/cuda/graph_memsets.h"
#include "core/cuda/launch.cuh"

namespace precis::cuda {

namespace {

template <typename T>
__global__ void fill_rows(char* dst, size_t pitch, size_t width, size_t height, T value) {
  precis::cuda::wait_for_previous_grid();  // a no-op here (a plain graph edge), kept as every kernel's first line
  const size_t n = width * height;
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x)
    reinterpret_cast<T*>(dst + (i / width) * pitch)[i % width] = value;
}

template <typename T>
void* fill_rows_function() {
  return reinterpret_cast<void*>(&fill_rows<T>);
}

bool is_memset(cudaGraphNode_t node) {
  cudaGraphNodeType type;
  if (cudaGraphNodeGetType(node, &type) != cudaSuccess) {
    cudaGetLastError();  // a node the runtime cannot name (cuda_graph.cu): not a memset
    return false;
  }
  return type == cudaGraphNodeTypeMemset;
}

std::vector<cudaGraphNode_t> nodes_of(cudaGraph_t graph, const char* op) {
  size_t count = 0;
  PRECIS_CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &count), op);
  std::vector<cudaGraphNode_t> nodes(count);
  PRECIS_CUDA_CHECK(cudaGraphGetNodes(graph, nodes.data(), &count), op);
  return nodes;
}

// The node's dependencies (incoming: true) or dependents, if every such edge is a plain one
// (a programmatic launch edge would need its data carried over: such a memset is left alone).
bool plain_edges(cudaGraphNode_t node, bool incoming, std::vector<cudaGraphNode_t>& out, const char* op) {
  size_t count = 0;
  auto query = [&](cudaGraphNode_t* nodes, cudaGraphEdgeData* edges) {
    return incoming ? cudaGraphNodeGetDependencies(node, nodes, edges, &count)
                    : cudaGraphNodeGetDependentNodes(node, nodes, edges, &count);
  };
  PRECIS_CUDA_CHECK(query(nullptr, nullptr), op);
  out.resize(count);
  std::vector<cudaGraphEdgeData> edges(count);
  PRECIS_CUDA_CHECK(query(out.data(), edges.data()), op);
  for (const cudaGraphEdgeData& e : edges)
    if (e.from_port != 0 || e.to_port != 0 || e.type != cudaGraphDependencyTypeDefault) return false;
  return true;
}

}  // namespace

size_t count_memset_nodes(cudaGraph_t graph) {
  size_t count = 0;
  for (cudaGraphNode_t node : nodes_of(graph, "count_memset_nodes")) count += is_memset(node);
  return count;
}

size_t replace_small_memsets(cudaGraph_t graph) {
  const char* op = "replace_small_memsets";
  size_t replaced = 0;
  for (cudaGraphNode_t node : nodes_of(graph, op)) {
    if (!is_memset(node)) continue;
    cudaMemsetParams m{};
    PRECIS_CUDA_CHECK(cudaGraphMemsetNodeGetParams(node, &m), op);
    const size_t bytes = m.width * m.height * m.elementSize;
    if (bytes == 0 || bytes > kSmallMemsetBytes) continue;
    std::vector<cudaGraphNode_t> before, after;
    if (!plain_edges(node, true, before, op) || !plain_edges(node, false, after, op)) continue;

    char* dst = static_cast<char*>(m.dst);
    size_t pitch = m.height > 1 ? m.pitch : m.width * m.elementSize;
    unsigned char byte = static_cast<unsigned char>(m.value);
    unsigned short half = static_cast<unsigned short>(m.value);
    unsigned int word = m.value;
    void* value = m.elementSize == 1   ? static_cast<void*>(&byte)
                  : m.elementSize == 2 ? static_cast<void*>(&half)
                                       : static_cast<void*>(&word);
    void* args[] = {&dst, &pitch, &m.width, &m.height, value};
    cudaKernelNodeParams k{};
    k.func = m.elementSize == 1   ? fill_rows_function<unsigned char>()
             : m.elementSize == 2 ? fill_rows_function<unsigned short>()
                                  : fill_rows_function<unsigned int>();
    const size_t elements = m.width * m.height;
    k.blockDim = dim3(256);
    k.gridDim = dim3(static_cast<unsigned>(std::min<size_t>((elements + 255) / 256, 64)));
    k.sharedMemBytes = 0;
    k.kernelParams = args;
    cudaGraphNode_t fill = nullptr;
    PRECIS_CUDA_CHECK(cudaGraphAddKernelNode(&fill, graph, before.data(), before.size(), &k), op);
    const std::vector<cudaGraphNode_t> from(after.size(), fill);
    if (!after.empty())
      PRECIS_CUDA_CHECK(cudaGraphAddDependencies(graph, from.data(), after.data(), nullptr, after.size()), op);
    PRECIS_CUDA_CHECK(cudaGraphDestroyNode(node), op);
    ++replaced;
  }
  return replaced;
}

}  // namespace precis::cuda
