// remove_implied_edges (core/cuda/graph_edges.h): the graph's edges as a DagEdge list, the
// implied ones found on the host, each removed with its own edge data.
#include <unordered_map>
#include <vector>

#include "core/cuda/cuda_check.h"
#include "core/cuda/graph_edges.h"
#include "core/implied_edges.h"

namespace precis::cuda {

size_t remove_implied_edges(cudaGraph_t graph) {
  const char* op = "remove_implied_edges";
  size_t num_nodes = 0, num_edges = 0;
  PRECIS_CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &num_nodes), op);
  std::vector<cudaGraphNode_t> nodes(num_nodes);
  PRECIS_CUDA_CHECK(cudaGraphGetNodes(graph, nodes.data(), &num_nodes), op);
  PRECIS_CUDA_CHECK(cudaGraphGetEdges(graph, nullptr, nullptr, nullptr, &num_edges), op);
  std::vector<cudaGraphNode_t> from(num_edges), to(num_edges);
  std::vector<cudaGraphEdgeData> data(num_edges);
  PRECIS_CUDA_CHECK(cudaGraphGetEdges(graph, from.data(), to.data(), data.data(), &num_edges), op);

  std::unordered_map<cudaGraphNode_t, size_t> index;
  for (size_t i = 0; i < num_nodes; ++i) index[nodes[i]] = i;
  std::vector<DagEdge> edges(num_edges);
  for (size_t e = 0; e < num_edges; ++e) {
    // A plain edge and a programmatic one (our kernels, launched with PDL, wait for the kernel
    // before them first: core/cuda/launch.cuh) order completion; a launch-completion edge does not.
    const bool completion = data[e].from_port != cudaGraphKernelNodePortLaunchCompletion;
    edges[e] = {index.at(from[e]), index.at(to[e]), completion};
  }
  const std::vector<size_t> implied = implied_edges(num_nodes, edges);
  for (size_t e : implied) PRECIS_CUDA_CHECK(cudaGraphRemoveDependencies(graph, &from[e], &to[e], &data[e], 1), op);
  return implied.size();
}

}  // namespace precis::cuda
