// Small memset nodes replaced by kernel nodes (core/cuda/graph_memsets.h): a capture with the
// replacement on holds no small memset node, a large one stays a memset, and the replay sets
// the same bytes as cudaMemsetAsync / cudaMemset2DAsync do eagerly (the reference), for
// element sizes 1 (any byte value), with pitched rows, and between kernels that read and
// write around them.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "core/copy.h"
#include "core/cuda/graph_memsets.h"
#include "core/cuda/runtime.h"
#include "core/cuda_graph.h"
#include "core/tensor.h"
#include "ops/elementwise.h"
#include "support/gpu.h"

using namespace precis;

namespace {

// The bytes of `t` (on the GPU) as the host sees them.
std::vector<uint8_t> bytes_of(const Tensor& t) {
  std::vector<uint8_t> out(t.nbytes());
  cuda::synchronize(t.device());
  EXPECT_EQ(cudaMemcpy(out.data(), t.raw_data(), out.size(), cudaMemcpyDeviceToHost), cudaSuccess);
  return out;
}

// Queues, on the compute stream: a kernel writing `a`, a 4-byte memset of `counter`'s second
// word, a 2D memset of 3 rows of 40 bytes (pitch 64) in `rows` to 0x5A, a large memset of `big`,
// and a kernel reading the counter's row into `b`.
void work(const Tensor& a, const Tensor& counter, const Tensor& rows, const Tensor& big, const Tensor& b) {
  cudaStream_t stream = cuda::compute_stream(a.device());
  copy_(a, a + 1.0);
  ASSERT_EQ(cudaMemsetAsync(static_cast<char*>(counter.raw_data()) + 4, 0, 4, stream), cudaSuccess);
  ASSERT_EQ(cudaMemset2DAsync(rows.raw_data(), 64, 0x5A, 40, 3, stream), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(big.raw_data(), 0x11, big.nbytes(), stream), cudaSuccess);
  copy_(b, counter * 2.0);
}

}  // namespace

TEST(GraphMemsets, SmallMemsetsBecomeKernelsThatSetTheSameBytes) {
  PRECIS_SKIP_WITHOUT_GPU();
  const Device gpu = Device::cuda(0);
  Tensor a = zeros({256}, DType::f32, gpu), b = zeros({4}, DType::f32, gpu);
  Tensor counter = full({4}, 7.0, DType::f32, gpu), rows = full({64}, -1.0, DType::f32, gpu);
  Tensor big = zeros({static_cast<int64_t>(cuda::kSmallMemsetBytes)}, DType::f32, gpu);  // 4x the limit

  // The reference: the same work run eagerly, from the same starting values.
  work(a, counter, rows, big, b);
  const std::vector<uint8_t> counter_bytes = bytes_of(counter), rows_bytes = bytes_of(rows);
  const std::vector<uint8_t> big_bytes = bytes_of(big), b_bytes = bytes_of(b), a_bytes = bytes_of(a);

  const bool was = graph_memset_kernels();
  for (bool on : {false, true}) {
    set_graph_memset_kernels(on);
    fill_(a, 0.0);
    fill_(b, 0.0);
    fill_(counter, 7.0);
    fill_(rows, -1.0);
    fill_(big, 0.0);
    CudaGraph graph(gpu);
    graph.capture([&] { work(a, counter, rows, big, b); });
    // Three memsets: the large one always stays one.
    EXPECT_EQ(graph.num_memset_nodes(), on ? 1u : 3u) << "replacement " << on;
    graph.replay();
    EXPECT_EQ(bytes_of(counter), counter_bytes) << "replacement " << on;
    EXPECT_EQ(bytes_of(rows), rows_bytes) << "replacement " << on;
    EXPECT_EQ(bytes_of(big), big_bytes) << "replacement " << on;
    EXPECT_EQ(bytes_of(b), b_bytes) << "the kernel after the memsets read their bytes, replacement " << on;
    EXPECT_EQ(bytes_of(a), a_bytes) << "replacement " << on;
  }
  set_graph_memset_kernels(was);
}
