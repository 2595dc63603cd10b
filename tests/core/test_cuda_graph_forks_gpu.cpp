// CudaGraph::num_forks (core/cuda_graph.h): a capture of one stream's work in order is a chain
// (no fork); work queued on the side stream (core/cuda/side_stream.h) and joined back makes one
// fork, and each fork after a join two (both streams' last nodes lead into both streams' next
// nodes). An edge that the other edges imply is removed by the capture (core/cuda/graph_edges.h).
// The trainer prints the count with its capture line, since a graph with forks replays every
// kernel later (bench/NOTES.md, the eleventh session). The values the replays compute are
// checked too, so the counts belong to graphs that do the work.
#include <gtest/gtest.h>

#include "core/copy.h"
#include "core/cuda/runtime.h"
#include "core/cuda/side_stream.h"
#include "core/cuda_graph.h"
#include "core/tensor.h"
#include "ops/elementwise.h"
#include "support/gpu.h"

using namespace precis;

TEST(CudaGraphForks, OneStreamIsAChainAndEachSideBranchIsAFork) {
  PRECIS_SKIP_WITHOUT_GPU();
  const Device gpu = Device::cuda(0);
  const int64_t n = 4096;
  Tensor source = ones({n}, DType::f32, gpu), main = zeros({n}, DType::f32, gpu);
  Tensor side = zeros({n}, DType::f32, gpu), sum = zeros({n}, DType::f32, gpu);

  CudaGraph chain(gpu);
  chain.capture([&] {
    copy_(main, source * 2.0);
    copy_(sum, main + source);
  });
  EXPECT_EQ(chain.num_forks(), 0u);
  chain.replay();
  EXPECT_EQ(sum.to_vector<double>(), std::vector<double>(n, 3.0));

  for (int branches : {1, 2}) {
    CudaGraph forked(gpu);
    forked.capture([&] {
      copy_(main, source * 2.0);
      for (int b = 0; b < branches; ++b) {
        {
          cuda::SideStreamScope on_side(gpu);
          copy_(side, source * 5.0);
        }
        copy_(main, main + 1.0);  // beside the side stream's work
        cuda::join_side_streams();
      }
      copy_(sum, main + side);
    });
    EXPECT_EQ(forked.num_forks(), branches == 1 ? 1u : 3u) << branches << " side branches";
    fill_(sum, 0.0);
    forked.replay();
    EXPECT_EQ(sum.to_vector<double>(), std::vector<double>(n, 2.0 + branches + 5.0)) << branches << " side branches";
  }
}

// The side stream waits for the compute stream twice: for all of its work so far, and for an
// event recorded after its first kernel, which that wait already covers. The capture holds an
// edge from the first kernel to the side kernel beside the path through the second kernel;
// removed, the first kernel leads only to the second, and the graph forks once: at the second,
// into the side kernel and the compute stream's next one.
TEST(CudaGraphForks, AnEdgeTheOtherEdgesImplyIsRemoved) {
  PRECIS_SKIP_WITHOUT_GPU();
  const Device gpu = Device::cuda(0);
  const int64_t n = 4096;
  Tensor source = ones({n}, DType::f32, gpu), first = zeros({n}, DType::f32, gpu);
  Tensor second = zeros({n}, DType::f32, gpu), side = zeros({n}, DType::f32, gpu);
  Tensor beside_it = zeros({n}, DType::f32, gpu);
  cudaEvent_t after_first = nullptr;
  ASSERT_EQ(cudaEventCreateWithFlags(&after_first, cudaEventDisableTiming), cudaSuccess);
  CudaGraph graph(gpu);
  graph.capture([&] {
    cudaStream_t compute = cuda::compute_stream(gpu), beside = cuda::side_stream(gpu);
    fill_(first, 2.0);
    ASSERT_EQ(cudaEventRecord(after_first, compute), cudaSuccess);
    fill_(second, 3.0);
    cuda::fork_side_stream(gpu);                                          // waits for both fills
    ASSERT_EQ(cudaStreamWaitEvent(beside, after_first, 0), cudaSuccess);  // implied by the fork
    {
      cuda::SideStreamScope on_side(gpu, cuda::SideStreamScope::Fork::made);
      copy_(side, first + second);
    }
    fill_(beside_it, 4.0);  // on the compute stream, beside the side stream's work
    cuda::join_side_streams();
  });
  cudaEventDestroy(after_first);
  EXPECT_EQ(graph.num_forks(), 1u);
  fill_(side, 0.0);
  graph.replay();
  EXPECT_EQ(side.to_vector<double>(), std::vector<double>(n, 5.0));
}
