// Memset hoisting (core/cuda/graph_memsets.h). cuBLASLt queues a memset node before products
// whose output has many rows (GPT-2's 16384-row products), cuDNN before some convolutions; each
// call captured runs on its own workspace slice, and the capture moves those memsets to one
// zeroing kernel at the graph's start. Replayed several times, such a graph must give the eager
// values bit for bit (the same algorithms, the same kernels): a counter left unzeroed between
// replays would skip tiles, a wrong programmatic edge would let a product read its input early,
// a zeroing that strayed out of its slice would clobber an operand, and a slice whose bytes an
// earlier node of the graph wrote would leave the counter unzeroed (scribble_on_freed_blocks). The count of the memset
// nodes checks the hoisting happened (or the test says cuBLASLt queued none here).
#include <gtest/gtest.h>

#include <iostream>
#include <vector>

#include "core/allocator.h"
#include "core/copy.h"
#include "core/cuda_graph.h"
#include "core/random.h"
#include "ops/conv.h"
#include "ops/ops.h"
#include "support/gpu.h"
#if PRECIS_WITH_CUDA
#include "core/cuda/graph_memsets.h"
#endif

using namespace precis;

#if PRECIS_WITH_CUDA

namespace {

// Restores the switch at the end of a test.
class HoistScope {
 public:
  explicit HoistScope(bool on) : previous_(cuda::memset_hoisting()) { cuda::set_memset_hoisting(on); }
  ~HoistScope() { cuda::set_memset_hoisting(previous_); }

 private:
  bool previous_;
};

std::vector<float> values(const Tensor& t) { return t.to(DType::f32).to_vector<float>(); }

// Tensors of 512 B to 1 MiB, written with nonzero bits and freed at once. In a capture their
// blocks join the capture's private pool, where an ordinary request looks first: a slice taken
// from there would be zeroed at the graph's start and then overwritten by these fills.
void scribble_on_freed_blocks(Device device) {
  for (int64_t bytes = 512; bytes <= (int64_t(1) << 20); bytes *= 2)
    fill_(empty({bytes / 4}, DType::f32, device), -1.0);
}

}  // namespace

TEST(MemsetHoistGpu, HoistedProductsReplayWithTheEagerBits) {
  PRECIS_SKIP_WITHOUT_GPU();
  const Device gpu = Device::cuda(0);
  // GPT-2's shapes: 16384 token rows through 768 -> 768 -> 3072 -> 768.
  const Tensor x = randn({16384, 768}, DType::f32).to(DType::bf16).to(gpu);
  const Tensor w1 = (randn({768, 768}, DType::f32) * 0.03).to(DType::bf16).to(gpu);
  const Tensor w2 = (randn({768, 3072}, DType::f32) * 0.03).to(DType::bf16).to(gpu);
  const Tensor w3 = (randn({3072, 768}, DType::f32) * 0.02).to(DType::bf16).to(gpu);
  auto products = [&] { return ops::matmul(ops::matmul(ops::matmul(x, w1), w2), w3); };

  size_t unhoisted_memsets = 0;
  for (const bool hoisting : {false, true}) {
    HoistScope scope(hoisting);
    const std::vector<float> eager = values(products());  // also chooses the algorithms, outside the capture
    Tensor out = empty({16384, 768}, DType::bf16, gpu);
    const size_t live_before = allocator_for(gpu).stats().allocated_bytes;
    {
      CudaGraph graph(gpu);
      graph.capture([&] {
        scribble_on_freed_blocks(gpu);
        copy_(out, products());
      });
      if (!hoisting) {
        unhoisted_memsets = graph.num_memset_nodes();
        EXPECT_EQ(graph.num_hoisted_memsets(), 0u);
      } else if (unhoisted_memsets > 0) {
        // Every product's memset is hoisted into the one zeroing kernel at the start.
        EXPECT_EQ(graph.num_hoisted_memsets(), unhoisted_memsets);
        EXPECT_EQ(graph.num_memset_nodes(), 0u);
      }
      for (int replay = 0; replay < 4; ++replay) {
        fill_(out, 0.0);
        graph.replay();
        EXPECT_EQ(values(out), eager) << "hoisting " << hoisting << ", replay " << replay;
      }
    }
    // The products' workspace slices are freed as the calls return, the graph's blocks with it.
    EXPECT_EQ(allocator_for(gpu).stats().allocated_bytes, live_before) << "hoisting " << hoisting;
  }
  if (unhoisted_memsets == 0) GTEST_SKIP() << "cuBLASLt queued no memset node for these products: nothing to hoist";
}

// ResNet-18's convolutions (CIFAR, B=256, bf16 channels-last): 3x3 64 -> 64 at 32x32 twice, then
// the 1x1 stride-2 64 -> 128 shortcut, on cuDNN's graph API and on its legacy one (both take
// slices). cuDNN's memsets may also aim at outputs, which stay where they are, so the counts are
// only printed; the replays must give the eager bits.
TEST(MemsetHoistGpu, HoistedConvolutionsReplayWithTheEagerBits) {
  PRECIS_SKIP_WITHOUT_GPU();
  const Device gpu = Device::cuda(0);
  auto on_gpu = [&](const Tensor& t) {
    return ops::to_memory_format(t.to(DType::bf16).to(gpu), ops::MemoryFormat::channels_last);
  };
  const Tensor x = on_gpu(randn({256, 64, 32, 32}, DType::f32));
  const Tensor w1 = on_gpu(randn({64, 64, 3, 3}, DType::f32) * 0.05);
  const Tensor w2 = on_gpu(randn({64, 64, 3, 3}, DType::f32) * 0.05);
  const Tensor w3 = on_gpu(randn({128, 64, 1, 1}, DType::f32) * 0.1);
  const ops::Conv2dOptions same{{1, 1}, {1, 1}, {1, 1}, 1}, down{{2, 2}, {0, 0}, {1, 1}, 1};
  auto convolutions = [&] {
    return ops::conv2d(ops::conv2d(ops::conv2d(x, w1, Tensor(), same), w2, Tensor(), same), w3, Tensor(), down);
  };
  const ops::CudnnConvApi api_before = ops::cudnn_conv_api();
  for (const ops::CudnnConvApi api : {ops::CudnnConvApi::graph, ops::CudnnConvApi::legacy}) {
    ops::set_cudnn_conv_api(api);
    const char* api_name = api == ops::CudnnConvApi::graph ? "graph API" : "legacy API";
    for (const bool hoisting : {false, true}) {
      HoistScope scope(hoisting);
      const Tensor first = convolutions();  // chooses the engines, outside the capture
      const std::vector<float> eager = values(first);
      Tensor out = empty(first.shape(), DType::bf16, gpu);
      CudaGraph graph(gpu);
      graph.capture([&] {
        scribble_on_freed_blocks(gpu);
        copy_(out, convolutions());
      });
      std::cout << api_name << ", hoisting " << hoisting << ": " << graph.num_memset_nodes() << " memset nodes, "
                << graph.num_hoisted_memsets() << " hoisted\n";
      for (int replay = 0; replay < 4; ++replay) {
        fill_(out, 0.0);
        graph.replay();
        EXPECT_EQ(values(out), eager) << api_name << ", hoisting " << hoisting << ", replay " << replay;
      }
    }
  }
  ops::set_cudnn_conv_api(api_before);
}

#endif
