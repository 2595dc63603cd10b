// GPU checks of the CUDA caching allocator (core/cuda/allocator.cu): no cudaMalloc
// in the steady state, statistics under random use on two streams, record_stream,
// empty_cache, the out-of-memory message and CUDA graph capture. Skipped, with
// the reason, where no GPU is usable.
#include <gtest/gtest.h>

#include "core/copy.h"
#include "core/tensor.h"
#include "support/gpu.h"

#if PRECIS_WITH_CUDA

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <random>
#include <thread>
#include <vector>

#include "core/cuda/caching_allocator.h"
#include "core/cuda/runtime.h"

using namespace precis;

namespace {

const Device gpu = Device::cuda(0);

void expect_contains(const std::string& message, const std::vector<std::string>& parts) {
  for (const std::string& part : parts)
    EXPECT_NE(message.find(part), std::string::npos) << "'" << part << "' in: " << message;
}

// Ends a stream capture however the test leaves its scope, so that a failed
// check does not leave the compute stream capturing for the tests after it.
struct CaptureScope {
  cudaStream_t stream;
  cudaGraph_t graph = nullptr;
  bool ended = false;

  explicit CaptureScope(cudaStream_t s) : stream(s) {
    EXPECT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
  }
  unsigned long long id() const {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    unsigned long long capture_id = 0;
    EXPECT_EQ(cudaStreamGetCaptureInfo(stream, &status, &capture_id), cudaSuccess);
    EXPECT_EQ(status, cudaStreamCaptureStatusActive);
    return capture_id;
  }
  cudaError_t end() {
    ended = true;
    return cudaStreamEndCapture(stream, &graph);
  }
  ~CaptureScope() {
    if (!ended) end();
    if (graph != nullptr) cudaGraphDestroy(graph);
  }
};

}  // namespace

TEST(AllocatorGpu, SteadyStateMakesNoCudaMalloc) {
  PRECIS_SKIP_WITHOUT_GPU();
  Allocator& alloc = allocator_for(gpu);
  const AllocatorStats start = alloc.stats();
  // A miniature training step: tensors of many sizes, some dropped mid-step, written by kernels.
  auto step = [&] {
    std::vector<Tensor> live;
    for (int64_t n : {1000, 4096, 1 << 18, 3 << 18, 7, 1 << 22, 12345, 5 << 20, 3 << 20}) {
      live.push_back(empty({n}, DType::f32, gpu));
      fill_(live.back(), 1.0);
      if (live.size() % 3 == 0) live.erase(live.begin());
    }
  };
  for (int warm_up = 0; warm_up < 3; ++warm_up) step();
  const AllocatorStats warm = alloc.stats();
  for (int i = 0; i < 20; ++i) step();
  cuda::synchronize(gpu);
  const AllocatorStats after = alloc.stats();
  EXPECT_EQ(after.num_system_allocs, warm.num_system_allocs) << "cudaMalloc in the steady state";
  EXPECT_EQ(after.num_system_frees, warm.num_system_frees);
  EXPECT_EQ(after.reserved_bytes, warm.reserved_bytes);
  EXPECT_EQ(after.allocated_bytes, start.allocated_bytes);
  EXPECT_EQ(after.num_allocs, warm.num_allocs + 20 * 9);
  EXPECT_GE(after.peak_bytes, start.allocated_bytes + (20u << 20));
}

// 1000 random requests (1 B to 16 MiB) on the compute and comm streams. Each
// block is filled with its own byte and checked before it is freed, so blocks
// that overlap would show; the statistics must add up throughout.
TEST(AllocatorGpu, RandomRequestsOnTwoStreams) {
  PRECIS_SKIP_WITHOUT_GPU();
  cuda::CachingAllocator& alloc = cuda::caching_allocator(gpu);
  alloc.empty_cache();
  const AllocatorStats start = alloc.stats();
  cudaStream_t streams[2] = {cuda::compute_stream(gpu), cuda::comm_stream(gpu)};
  struct Live {
    char* ptr;
    size_t n;
    cudaStream_t stream;
    unsigned char tag;
  };
  std::vector<Live> live;
  size_t rounded_live = 0, peak_rounded = 0, allocations = 0;
  auto release = [&](size_t k) {
    const Live& block = live[k];
    unsigned char first = 0, last = 0;
    ASSERT_EQ(cudaMemcpyAsync(&first, block.ptr, 1, cudaMemcpyDeviceToHost, block.stream), cudaSuccess);
    ASSERT_EQ(cudaMemcpyAsync(&last, block.ptr + block.n - 1, 1, cudaMemcpyDeviceToHost, block.stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(block.stream), cudaSuccess);
    EXPECT_EQ(first, block.tag);
    EXPECT_EQ(last, block.tag);
    rounded_live -= cuda::round_size(block.n);
    alloc.deallocate(block.ptr, block.n);
    live.erase(live.begin() + k);
  };
  std::mt19937_64 rng(2024);
  for (int i = 0; i < 1000; ++i) {
    if (live.size() < 32 && (live.empty() || rng() % 3 != 0)) {
      size_t n = size_t(1) << (rng() % 24);
      n += rng() % n;
      cudaStream_t stream = streams[rng() % 2];
      auto* ptr = static_cast<char*>(alloc.allocate(n, stream));
      unsigned char tag = static_cast<unsigned char>(1 + i % 251);
      ASSERT_EQ(cudaMemsetAsync(ptr, tag, n, stream), cudaSuccess);
      live.push_back({ptr, n, stream, tag});
      ++allocations;
      rounded_live += cuda::round_size(n);
      peak_rounded = std::max(peak_rounded, rounded_live);
    } else {
      release(rng() % live.size());
    }
    const AllocatorStats now = alloc.stats();
    // Blocks are the rounded request, or up to 1 MiB more (a remainder too small to split off).
    ASSERT_GE(now.allocated_bytes - start.allocated_bytes, rounded_live);
    ASSERT_LE(now.allocated_bytes - start.allocated_bytes, rounded_live + live.size() * cuda::kSmallSize);
    ASSERT_GE(now.peak_bytes, now.allocated_bytes);
    ASSERT_GE(now.reserved_bytes, now.allocated_bytes);
  }
  while (!live.empty()) release(live.size() - 1);
  const AllocatorStats end = alloc.stats();
  EXPECT_EQ(end.allocated_bytes, start.allocated_bytes);
  EXPECT_EQ(end.num_allocs - start.num_allocs, allocations);
  // Reuse keeps what is held near what was live at once (tests/core/test_block_pool.cpp runs the same bound).
  EXPECT_LE(end.reserved_bytes - start.reserved_bytes,
            2 * (peak_rounded + 32 * cuda::kSmallSize) + 4 * cuda::kLargeSegment);
  alloc.empty_cache();
  EXPECT_EQ(alloc.stats().reserved_bytes, start.reserved_bytes);
}

// A block freed while the comm stream still uses it is not handed out again
// until that use is over.
TEST(AllocatorGpu, RecordStreamDelaysReuse) {
  PRECIS_SKIP_WITHOUT_GPU();
  cuda::CachingAllocator& alloc = cuda::caching_allocator(gpu);
  alloc.empty_cache();
  cudaStream_t compute = cuda::compute_stream(gpu), comm = cuda::comm_stream(gpu);
  const size_t n = 12 << 20;  // a segment of its own
  // Two cached segments, so that nothing below needs cudaMalloc while the comm stream is held.
  void* x = alloc.allocate(n, compute);
  void* y = alloc.allocate(n, compute);
  alloc.deallocate(x, n);
  alloc.deallocate(y, n);
  void* a = alloc.allocate(n, compute);
  // The comm stream waits at a host function until the test opens the gate, then writes a.
  std::atomic<bool> gate{false};
  struct OpenGate {
    std::atomic<bool>& gate;
    cudaStream_t comm;
    ~OpenGate() {
      gate = true;
      cudaStreamSynchronize(comm);
    }
  } open_gate{gate, comm};
  ASSERT_EQ(cudaLaunchHostFunc(
                comm,
                [](void* flag) {
                  while (!static_cast<std::atomic<bool>*>(flag)->load()) std::this_thread::yield();
                },
                &gate),
            cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(a, 1, n, comm), cudaSuccess);
  cuda::record_stream(static_cast<char*>(a) + 100, comm);  // any address inside the block will do
  alloc.deallocate(a, n);
  void* b = alloc.allocate(n, compute);
  EXPECT_NE(b, a) << "handed out while the comm stream still uses it";
  EXPECT_TRUE(b == x || b == y);
  gate = true;
  ASSERT_EQ(cudaStreamSynchronize(comm), cudaSuccess);
  void* c = alloc.allocate(n, compute);
  EXPECT_EQ(c, a) << "not reused once the comm stream is done with it";
  alloc.deallocate(b, n);
  alloc.deallocate(c, n);
}

TEST(AllocatorGpu, EmptyCacheGivesUnusedSegmentsBack) {
  PRECIS_SKIP_WITHOUT_GPU();
  cuda::CachingAllocator& alloc = cuda::caching_allocator(gpu);
  alloc.empty_cache();
  const AllocatorStats start = alloc.stats();
  Tensor kept = empty({1 << 20}, DType::f32, gpu);         // 4 MiB of a 20 MiB segment
  { Tensor dropped = empty({6 << 20}, DType::f32, gpu); }  // a 24 MiB segment of its own
  EXPECT_EQ(alloc.stats().reserved_bytes, start.reserved_bytes + (20u << 20) + (24u << 20));
  alloc.empty_cache();  // the 24 MiB segment is unused; the 20 MiB one holds `kept`
  EXPECT_EQ(alloc.stats().reserved_bytes, start.reserved_bytes + (20u << 20));
  EXPECT_EQ(alloc.stats().num_system_frees, start.num_system_frees + 1);
}

TEST(AllocatorGpu, OutOfMemoryMessageSaysWhatWasAskedAndWhatIsHeld) {
  PRECIS_SKIP_WITHOUT_GPU();
  Allocator& alloc = allocator_for(gpu);
  { Tensor cached = empty({3 << 20}, DType::f32, gpu); }  // an unused segment for the retry to give back
  const AllocatorStats before = alloc.stats();
  try {
    Tensor huge = empty({int64_t(1) << 48}, DType::f32, gpu);  // 1 PiB
    FAIL() << "allocated 1 PiB";
  } catch (const Error& e) {
    expect_contains(e.what(), {"CUDA out of memory on cuda:0", "tried to allocate 1.00 PiB", "allocated", "reserved",
                               "free of", "Reduce the batch size"});
  }
  EXPECT_EQ(alloc.stats().allocated_bytes, before.allocated_bytes);
  EXPECT_GT(alloc.stats().num_system_frees, before.num_system_frees) << "the cache was not emptied before the retry";
  // The device still works.
  Tensor t = full({10}, 2.0, DType::f32, gpu);
  EXPECT_EQ(t.to_vector<float>(), std::vector<float>(10, 2.0f));
}

// Warm up, capture: the capture's allocations come from the cache, the graph
// replays, and its memory is kept from eager code until the graph is released.
TEST(AllocatorGpu, GraphCaptureIsServedFromTheCache) {
  PRECIS_SKIP_WITHOUT_GPU();
  cuda::CachingAllocator& alloc = cuda::caching_allocator(gpu);
  cudaStream_t stream = cuda::compute_stream(gpu);
  Tensor out = zeros({1 << 16}, DType::f32, gpu);
  void* temp_ptr = nullptr;
  auto work = [&] {
    Tensor temp = empty({1 << 16}, DType::f32, gpu);
    temp_ptr = temp.raw_data();
    fill_(temp, 2.0);
    accumulate_(out, temp);
  };
  work();  // warm-up: out = 2, and the cache holds temp's size
  cuda::synchronize(gpu);
  const AllocatorStats warm = alloc.stats();
  unsigned long long capture_id = 0;
  cudaGraphExec_t exec = nullptr;
  {
    CaptureScope capture(stream);
    capture_id = capture.id();
    work();
    ASSERT_EQ(capture.end(), cudaSuccess);
    ASSERT_EQ(cudaGraphInstantiate(&exec, capture.graph, 0), cudaSuccess);
  }
  EXPECT_EQ(alloc.stats().num_system_allocs, warm.num_system_allocs);
  void* graph_temp = temp_ptr;
  for (int replay = 0; replay < 2; ++replay) ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
  cuda::synchronize(gpu);
  EXPECT_EQ(out.to_vector<float>(), std::vector<float>(1 << 16, 6.0f));  // 2 + two replays of + 2
  {
    Tensor eager = empty({1 << 16}, DType::f32, gpu);
    EXPECT_NE(eager.raw_data(), graph_temp) << "the graph's memory was handed to eager code";
  }
  ASSERT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
  alloc.release_graph_pool(capture_id);
}

// A cache miss during a capture takes a new segment (cudaMalloc with the thread's capture
// mode relaxed): the capture stays valid, the graph replays into the new block, and the
// block stays the graph's until the graph is released.
TEST(AllocatorGpu, GraphCaptureCacheMissGrowsThePrivatePool) {
  PRECIS_SKIP_WITHOUT_GPU();
  cuda::CachingAllocator& alloc = cuda::caching_allocator(gpu);
  alloc.empty_cache();
  const int64_t n = int64_t(1) << 24;  // 64 MiB: a segment of its own, no remainder in the cache
  Tensor out = zeros({n}, DType::f32, gpu);
  cuda::synchronize(gpu);
  const AllocatorStats before = alloc.stats();
  void* temp_ptr = nullptr;
  unsigned long long capture_id = 0;
  cudaGraphExec_t exec = nullptr;
  {
    CaptureScope capture(cuda::compute_stream(gpu));
    capture_id = capture.id();
    Tensor temp = empty({n}, DType::f32, gpu);  // nothing free in the emptied cache fits it
    temp_ptr = temp.raw_data();
    fill_(temp, 3.0);
    accumulate_(out, temp);
    ASSERT_EQ(capture.end(), cudaSuccess);
    ASSERT_EQ(cudaGraphInstantiate(&exec, capture.graph, 0), cudaSuccess);
  }
  EXPECT_EQ(alloc.stats().num_system_allocs, before.num_system_allocs + 1);
  ASSERT_EQ(cudaGraphLaunch(exec, cuda::compute_stream(gpu)), cudaSuccess);
  cuda::synchronize(gpu);
  EXPECT_EQ(out.to_vector<float>(), std::vector<float>(n, 3.0f));
  {
    Tensor eager = empty({n}, DType::f32, gpu);
    EXPECT_NE(eager.raw_data(), temp_ptr) << "the graph's memory was handed to eager code";
  }
  ASSERT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
  alloc.release_graph_pool(capture_id);
}

// A request CUDA cannot serve during a capture is a clear error, and the capture goes on intact.
TEST(AllocatorGpu, GraphCaptureOutOfMemoryIsAClearError) {
  PRECIS_SKIP_WITHOUT_GPU();
  Tensor small = zeros({16}, DType::f32, gpu);
  CaptureScope capture(cuda::compute_stream(gpu));
  try {
    Tensor huge = empty({int64_t(1) << 40}, DType::f32, gpu);  // 4 TiB
    FAIL() << "allocated 4 TiB during a capture";
  } catch (const Error& e) {
    expect_contains(
        e.what(), {"CUDA graph capture", "4.00 TiB", "cannot be served from the cache", "no memory for a new segment"});
  }
  fill_(small, 1.0);
  EXPECT_EQ(capture.end(), cudaSuccess);
}

#else

TEST(AllocatorGpu, NeedsTheCudaBackend) { GTEST_SKIP() << "this build of Precis has no CUDA backend"; }

#endif
