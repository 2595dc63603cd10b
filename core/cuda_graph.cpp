// CudaGraph in a build without CUDA: it can be made and asked, but not captured.
#include "core/cuda_graph.h"

#include "core/error.h"

#if !PRECIS_WITH_CUDA

namespace precis {

struct CudaGraph::State {};

CudaGraph::CudaGraph(Device device) : device_(device), state_(std::make_unique<State>()) {}
CudaGraph::~CudaGraph() = default;

void CudaGraph::capture(const std::function<void()>&) {
  PRECIS_FAIL("CUDA graph capture: this build of Precis has no CUDA backend");
}

void CudaGraph::replay(const std::vector<std::pair<void*, void*>>&) {
  PRECIS_FAIL("CudaGraph::replay: this build of Precis has no CUDA backend");
}

bool CudaGraph::has_event_node(void*) const { return false; }

bool CudaGraph::captured() const { return false; }

size_t CudaGraph::num_nodes() const { return 0; }

size_t CudaGraph::num_forks() const { return 0; }

size_t CudaGraph::num_memset_nodes() const { return 0; }

size_t CudaGraph::num_hoisted_memsets() const { return 0; }

}  // namespace precis

#endif
