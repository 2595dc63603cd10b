// CudaGraph::num_forks (core/cuda_graph.h): a capture of one stream's work in order is a chain
// (no fork); work queued on the side stream (core/cuda/side_stream.h) and joined back makes one
// fork per branch. The trainer prints the count with its capture line, since a graph with forks
// replays every kernel later (bench/NOTES.md, the eleventh session). The values the replays
// compute are checked too, so the counts belong to graphs that do the work.
#include <gtest/gtest.h>

#include "core/copy.h"
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
    EXPECT_EQ(forked.num_forks(), static_cast<size_t>(branches)) << branches << " side branches";
    fill_(sum, 0.0);
    forked.replay();
    EXPECT_EQ(sum.to_vector<double>(), std::vector<double>(n, 2.0 + branches + 5.0)) << branches << " side branches";
  }
}
