// The caching allocator's bookkeeping (core/cuda/block_pool.h) on the CPU, with
// a fake system allocator that hands out addresses without memory behind them.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>

#include "core/cuda/block_pool.h"

using namespace precis;
using namespace precis::cuda;

namespace {

constexpr size_t KiB = 1024, MiB = 1024 * KiB;

// Addresses 1 TiB apart, so segments never touch; a capacity to run out of.
struct FakeSystem {
  size_t capacity = SIZE_MAX;
  size_t in_use = 0;
  uintptr_t next = uintptr_t(1) << 40;
  std::map<void*, size_t> live;
  int allocs = 0, frees = 0, refused = 0;

  BlockPool pool() {
    return BlockPool(
        [this](size_t n) -> void* {
          if (n > capacity - in_use) {
            ++refused;
            return nullptr;
          }
          void* ptr = reinterpret_cast<void*>(next);
          next += uintptr_t(1) << 40;
          live[ptr] = n;
          in_use += n;
          ++allocs;
          return ptr;
        },
        [this](void* ptr, size_t n) {
          ASSERT_EQ(live.at(ptr), n);
          live.erase(ptr);
          in_use -= n;
          ++frees;
        });
  }
};

StreamId stream_a = reinterpret_cast<StreamId>(0x1000);
StreamId stream_b = reinterpret_cast<StreamId>(0x2000);

}  // namespace

TEST(BlockPool, RoundsRequestsToSizeClasses) {
  EXPECT_EQ(round_size(0), 512u);
  EXPECT_EQ(round_size(1), 512u);
  EXPECT_EQ(round_size(512), 512u);
  EXPECT_EQ(round_size(513), 1024u);
  EXPECT_EQ(round_size(MiB), MiB);
  EXPECT_EQ(round_size(MiB + 1), MiB + 512);
  EXPECT_EQ(segment_size_for(512), 2 * MiB);
  EXPECT_EQ(segment_size_for(MiB), 2 * MiB);
  EXPECT_EQ(segment_size_for(MiB + 512), 20 * MiB);
  EXPECT_EQ(segment_size_for(10 * MiB - 512), 20 * MiB);
  EXPECT_EQ(segment_size_for(10 * MiB), 10 * MiB);
  EXPECT_EQ(segment_size_for(10 * MiB + 512), 12 * MiB);
}

TEST(BlockPool, FormatsBytes) {
  EXPECT_EQ(format_bytes(512), "512 B");
  EXPECT_EQ(format_bytes(1536), "1.50 KiB");
  EXPECT_EQ(format_bytes(20 * MiB), "20.00 MiB");
  EXPECT_EQ(format_bytes(size_t(1) << 50), "1.00 PiB");
}

TEST(BlockPool, SmallRequestsShareOneSegment) {
  FakeSystem system;
  BlockPool pool = system.pool();
  std::vector<Block*> blocks;
  for (int i = 0; i < 100; ++i) blocks.push_back(pool.allocate(1000, stream_a, 0, true));
  EXPECT_EQ(system.allocs, 1);
  EXPECT_EQ(pool.stats().reserved_bytes, 2 * MiB);
  EXPECT_EQ(pool.stats().allocated_bytes, 100 * 1024u);
  EXPECT_EQ(pool.stats().num_allocs, 100u);
  std::sort(blocks.begin(), blocks.end(), [](Block* a, Block* b) { return a->ptr < b->ptr; });
  for (size_t i = 1; i < blocks.size(); ++i) EXPECT_GE(blocks[i]->ptr, blocks[i - 1]->ptr + blocks[i - 1]->size);
  for (Block* b : blocks) EXPECT_EQ(reinterpret_cast<uintptr_t>(b->ptr) % 512, 0u);
  for (Block* b : blocks) pool.free(b);
  EXPECT_EQ(pool.stats().allocated_bytes, 0u);
  EXPECT_EQ(pool.stats().peak_bytes, 100 * 1024u);
}

TEST(BlockPool, SteadyStateMakesNoSystemAllocations) {
  FakeSystem system;
  BlockPool pool = system.pool();
  const std::vector<size_t> step = {4 * MiB, 100, 3 * KiB, 30 * MiB, 700 * KiB, 12 * MiB + 5, 1, 2 * MiB};
  int after_first_step = 0;
  for (int iteration = 0; iteration < 20; ++iteration) {
    std::vector<Block*> live;
    for (size_t n : step) live.push_back(pool.allocate(n, stream_a, 0, true));
    for (size_t i = 0; i < live.size(); i += 2) pool.free(live[i]);
    for (size_t i = 1; i < live.size(); i += 2) pool.free(live[i]);
    if (iteration == 0) after_first_step = system.allocs;
  }
  // A 2 MiB small segment, a 20 MiB one shared by the 4, 12 and 2 MiB requests, and 30 MiB.
  EXPECT_EQ(after_first_step, 3);
  EXPECT_EQ(system.allocs, after_first_step);
  EXPECT_EQ(pool.stats().num_allocs, 20 * step.size());
  EXPECT_EQ(pool.stats().allocated_bytes, 0u);
}

TEST(BlockPool, MergesFreeNeighboursAndReleasesWholeSegments) {
  FakeSystem system;
  BlockPool pool = system.pool();
  Block* a = pool.allocate(256 * KiB, stream_a, 0, true);
  Block* b = pool.allocate(256 * KiB, stream_a, 0, true);
  Block* c = pool.allocate(256 * KiB, stream_a, 0, true);
  EXPECT_EQ(b->ptr, a->ptr + 256 * KiB);
  EXPECT_EQ(c->ptr, b->ptr + 256 * KiB);
  char* base = a->ptr;
  pool.free(a);
  pool.free(c);
  EXPECT_EQ(pool.release_cached(), 0u);  // b still holds the segment
  pool.free(b);
  // One free block spans the whole segment again: the largest small request lands at its start.
  Block* d = pool.allocate(MiB, stream_a, 0, true);
  EXPECT_EQ(d->ptr, base);
  pool.free(d);
  EXPECT_EQ(pool.release_cached(), 2 * MiB);
  EXPECT_EQ(pool.stats().reserved_bytes, 0u);
  EXPECT_EQ(system.frees, 1);
  EXPECT_TRUE(system.live.empty());
}

TEST(BlockPool, LargeBlocksSplitOnlyWhenMoreThanOneMiBRemains) {
  FakeSystem system;
  BlockPool pool = system.pool();
  Block* a = pool.allocate(1536 * KiB, stream_a, 0, true);
  EXPECT_EQ(a->size, 1536 * KiB);
  EXPECT_EQ(pool.stats().reserved_bytes, 20 * MiB);
  Block* b = pool.allocate(18 * MiB, stream_a, 0, true);  // 18.5 MiB left: 0.5 MiB is not worth a block
  EXPECT_EQ(b->ptr, a->ptr + 1536 * KiB);
  EXPECT_EQ(b->size, 18 * MiB + 512 * KiB);
  EXPECT_EQ(pool.stats().allocated_bytes, 20 * MiB);
  EXPECT_EQ(system.allocs, 1);
}

TEST(BlockPool, BlocksStayWithTheirStream) {
  FakeSystem system;
  BlockPool pool = system.pool();
  Block* a = pool.allocate(12 * MiB, stream_a, 0, true);
  char* a_ptr = a->ptr;
  pool.free(a);
  Block* b = pool.allocate(12 * MiB, stream_b, 0, true);
  EXPECT_NE(b->ptr, a_ptr);
  EXPECT_EQ(system.allocs, 2);
  Block* c = pool.allocate(12 * MiB, stream_a, 0, true);
  EXPECT_EQ(c->ptr, a_ptr);
  EXPECT_EQ(system.allocs, 2);
}

TEST(BlockPool, PendingEventsDelayReuse) {
  FakeSystem system;
  BlockPool pool = system.pool();
  Block* a = pool.allocate(12 * MiB, stream_a, 0, true);
  char* a_ptr = a->ptr;
  a->pending_events = 2;  // used by two other streams
  pool.free(a);
  EXPECT_EQ(pool.stats().allocated_bytes, 0u);
  Block* b = pool.allocate(12 * MiB, stream_a, 0, true);
  EXPECT_NE(b->ptr, a_ptr);
  pool.event_done(a);
  EXPECT_EQ(pool.allocate(12 * MiB, stream_a, 0, false), nullptr);
  pool.event_done(a);
  Block* c = pool.allocate(12 * MiB, stream_a, 0, false);
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->ptr, a_ptr);
}

TEST(BlockPool, FindsTheBlockHoldingAnAddress) {
  FakeSystem system;
  BlockPool pool = system.pool();
  Block* a = pool.allocate(3000, stream_a, 0, true);
  char* ptr = a->ptr;
  EXPECT_EQ(pool.find(ptr), a);
  EXPECT_EQ(pool.find(ptr + 2999), a);
  EXPECT_EQ(pool.find(ptr + a->size), nullptr);
  EXPECT_EQ(pool.find(ptr - 1), nullptr);
  pool.free(a);
  EXPECT_EQ(pool.find(ptr), nullptr);
}

TEST(BlockPool, OutOfMemoryReleasesTheCacheAndRetriesOnce) {
  FakeSystem system;
  system.capacity = 30 * MiB;
  BlockPool pool = system.pool();
  Block* a = pool.allocate(12 * MiB, stream_a, 0, true);
  pool.free(a);
  Block* b = pool.allocate(24 * MiB, stream_a, 0, true);  // needs the cached 12 MiB back
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(system.refused, 1);
  EXPECT_EQ(system.frees, 1);
  EXPECT_EQ(pool.stats().reserved_bytes, 24 * MiB);
  EXPECT_EQ(pool.allocate(12 * MiB, stream_a, 0, true), nullptr);  // nothing left to release
  EXPECT_EQ(pool.stats().allocated_bytes, 24 * MiB);
  EXPECT_EQ(pool.allocate(size_t(1) << 62, stream_a, 0, true), nullptr);
}

// During a capture the pool may grow but must not give segments back (cudaFree is not
// capturable): out of memory then fails without releasing the cache.
TEST(BlockPool, OutOfMemoryWithoutReleaseKeepsTheCache) {
  FakeSystem system;
  system.capacity = 30 * MiB;
  BlockPool pool = system.pool();
  Block* a = pool.allocate(12 * MiB, stream_a, 0, true);
  pool.free(a);
  EXPECT_EQ(pool.allocate(24 * MiB, stream_a, 7, true, /*may_release=*/false), nullptr);
  EXPECT_EQ(system.refused, 1);
  EXPECT_EQ(system.frees, 0);
  EXPECT_EQ(pool.stats().reserved_bytes, 12 * MiB);
  Block* grown = pool.allocate(16 * MiB, stream_a, 7, true, /*may_release=*/false);  // fits beside the cache
  ASSERT_NE(grown, nullptr);
  EXPECT_EQ(grown->graph, 7u);
  EXPECT_EQ(system.allocs, 2);
}

TEST(BlockPool, NoGrowthWhenForbidden) {
  FakeSystem system;
  BlockPool pool = system.pool();
  EXPECT_EQ(pool.allocate(1000, stream_a, 0, false), nullptr);
  EXPECT_EQ(system.allocs, 0);
  Block* a = pool.allocate(1000, stream_a, 0, true);
  pool.free(a);
  EXPECT_NE(pool.allocate(1000, stream_a, 0, false), nullptr);
  EXPECT_EQ(system.allocs, 1);
}

TEST(BlockPool, CaptureKeepsItsBlocksUntilReleased) {
  FakeSystem system;
  BlockPool pool = system.pool();
  const uint64_t graph = 7;
  Block* warm = pool.allocate(12 * MiB, stream_a, 0, true);
  char* ptr = warm->ptr;
  pool.free(warm);
  // The capture takes the warm block; once freed it stays in the capture's pool.
  Block* captured = pool.allocate(12 * MiB, stream_a, graph, false);
  ASSERT_NE(captured, nullptr);
  EXPECT_EQ(captured->ptr, ptr);
  pool.free(captured);
  EXPECT_EQ(pool.allocate(12 * MiB, stream_a, 0, false), nullptr);
  Block* again = pool.allocate(12 * MiB, stream_a, graph, false);
  ASSERT_NE(again, nullptr);
  EXPECT_EQ(again->ptr, ptr);
  pool.free(again);
  EXPECT_EQ(pool.release_cached(), 0u);  // the graph's memory is not the cache's to give back
  pool.release_graph(graph);
  Block* after = pool.allocate(12 * MiB, stream_a, 0, false);
  ASSERT_NE(after, nullptr);
  EXPECT_EQ(after->ptr, ptr);
  EXPECT_EQ(system.allocs, 1);
}

// A replayed graph writes the blocks its capture freed, so they count in the peak as live
// memory does (a step replayed from a graph needs them as an eager step needs its
// activations), until the graph is released.
TEST(BlockPool, GraphPoolBytesCountInThePeakUntilReleased) {
  FakeSystem system;
  BlockPool pool = system.pool();
  const uint64_t graph = 7;
  Block* persistent = pool.allocate(4 * MiB, stream_a, 0, true);  // lives outside the capture
  // The capture takes three neighbours of one segment and frees them in an order that merges
  // them within its pool.
  Block* a = pool.allocate(2 * MiB, stream_a, graph, true, false);
  Block* b = pool.allocate(3 * MiB, stream_a, graph, true, false);
  Block* c = pool.allocate(1536 * 1024, stream_a, graph, true, false);
  ASSERT_TRUE(a && b && c);
  const size_t captured = a->size + b->size + c->size;
  EXPECT_EQ(pool.stats().peak_bytes, persistent->size + captured);
  for (Block* block : {a, c, b}) pool.free(block);
  EXPECT_EQ(pool.stats().allocated_bytes, persistent->size);
  EXPECT_EQ(pool.stats().graph_pool_bytes, captured);
  pool.reset_peak();
  EXPECT_EQ(pool.stats().peak_bytes, persistent->size + captured) << "a reset keeps what the graph holds";
  // A replay's own request comes from the graph's pool: split, the rest stays the graph's.
  Block* again = pool.allocate(2 * MiB, stream_a, graph, false, false);
  ASSERT_NE(again, nullptr);
  EXPECT_EQ(pool.stats().graph_pool_bytes, captured - again->size);
  EXPECT_EQ(pool.stats().peak_bytes, persistent->size + captured) << "taking from the graph's pool adds nothing";
  pool.free(again);
  EXPECT_EQ(pool.stats().graph_pool_bytes, captured);
  // A block of the general pool allocated beside the graph's bytes raises the peak on top of them.
  Block* general = pool.allocate(5 * MiB, stream_a, 0, true);
  EXPECT_EQ(pool.stats().peak_bytes, persistent->size + captured + general->size);
  pool.free(general);
  pool.release_graph(graph);
  EXPECT_EQ(pool.stats().graph_pool_bytes, 0u);
  pool.reset_peak();
  EXPECT_EQ(pool.stats().peak_bytes, persistent->size);
  pool.free(persistent);
}

TEST(BlockPool, CaptureTakesOnlyWhatItUses) {
  FakeSystem system;
  BlockPool pool = system.pool();
  Block* warm = pool.allocate(1000, stream_a, 0, true);  // a 2 MiB small segment
  pool.free(warm);
  Block* captured = pool.allocate(1000, stream_a, 3, false);
  ASSERT_NE(captured, nullptr);
  char* captured_ptr = captured->ptr;
  pool.free(captured);
  // The rest of the segment stays general, and does not merge with the graph's block.
  Block* general = pool.allocate(MiB, stream_a, 0, false);
  ASSERT_NE(general, nullptr);
  EXPECT_EQ(general->ptr, captured_ptr + 1024);
  pool.free(general);
  EXPECT_EQ(pool.release_cached(), 0u);
  pool.release_graph(3);
  EXPECT_EQ(pool.release_cached(), 2 * MiB);  // merged back into one free segment
  EXPECT_TRUE(system.live.empty());
}

// A capture's library call asks for a workspace no node captured so far has touched
// (core/cuda/graph_memsets.h): the capture's own freed block, the best fit, is passed over for
// a general one, and that block joins the capture's pool once it is taken.
TEST(BlockPool, UnusedByGraphSkipsTheCapturesFreedBlocks) {
  FakeSystem system;
  BlockPool pool = system.pool();
  const uint64_t graph = 5;
  Block* warm = pool.allocate(1000, stream_a, 0, true);  // a 2 MiB small segment
  pool.free(warm);
  Block* tensor = pool.allocate(1000, stream_a, graph, false);  // a tensor of the capture, then freed
  ASSERT_NE(tensor, nullptr);
  char* used = tensor->ptr;
  pool.free(tensor);
  Block* slice = pool.allocate(512, stream_a, graph, false, false, /*unused_by_graph=*/true);
  ASSERT_NE(slice, nullptr);
  EXPECT_GE(slice->ptr, used + 1024);  // not the freed tensor's bytes
  EXPECT_EQ(slice->graph, graph);
  char* slice_ptr = slice->ptr;
  pool.free(slice);
  // Without the flag the capture reuses its own blocks first, the slice's among them.
  Block* reuse = pool.allocate(512, stream_a, graph, false);
  ASSERT_NE(reuse, nullptr);
  EXPECT_TRUE(reuse->ptr == used || reuse->ptr == slice_ptr);
  pool.free(reuse);
  // Nothing general left that fits: an unused block needs a new segment, and may have one.
  Block* big = pool.allocate(MiB, stream_a, 0, false);
  Block* rest = pool.allocate(MiB - 1536, stream_a, 0, false);  // the segment is all handed out now
  ASSERT_NE(big, nullptr);
  ASSERT_NE(rest, nullptr);
  EXPECT_EQ(pool.allocate(512, stream_a, graph, false, false, true), nullptr);
  Block* grown = pool.allocate(512, stream_a, graph, true, false, true);
  ASSERT_NE(grown, nullptr);
  EXPECT_EQ(system.allocs, 2);
}

// Random requests on two streams: live blocks never overlap, the statistics add
// up, and once everything is freed every segment is whole again.
TEST(BlockPool, RandomRequestsOnTwoStreams) {
  FakeSystem system;
  BlockPool pool = system.pool();
  std::mt19937_64 rng(1234);
  std::vector<Block*> live;
  size_t live_bytes = 0, peak_live = 0;
  for (int i = 0; i < 5000; ++i) {
    if (live.size() < 40 && (live.empty() || rng() % 3 != 0)) {
      // Sizes spread over 1 B .. 32 MiB, log-uniformly.
      size_t n = size_t(1) << (rng() % 25);
      n += rng() % n;
      Block* b = pool.allocate(n, rng() % 2 ? stream_a : stream_b, 0, true);
      ASSERT_NE(b, nullptr);
      ASSERT_GE(b->size, n);
      live.push_back(b);
      live_bytes += b->size;
      peak_live = std::max(peak_live, live_bytes);
    } else {
      size_t k = rng() % live.size();
      live_bytes -= live[k]->size;
      pool.free(live[k]);
      live.erase(live.begin() + k);
    }
    ASSERT_EQ(pool.stats().allocated_bytes, live_bytes);
    ASSERT_GE(pool.stats().peak_bytes, live_bytes);
    std::vector<Block*> sorted = live;
    std::sort(sorted.begin(), sorted.end(), [](Block* a, Block* b) { return a->ptr < b->ptr; });
    for (size_t j = 1; j < sorted.size(); ++j) ASSERT_GE(sorted[j]->ptr, sorted[j - 1]->ptr + sorted[j - 1]->size);
  }
  EXPECT_EQ(pool.stats().peak_bytes, peak_live);
  EXPECT_LE(pool.stats().reserved_bytes, 2 * peak_live + 4 * kLargeSegment);
  for (Block* b : live) pool.free(b);
  EXPECT_EQ(pool.stats().allocated_bytes, 0u);
  pool.release_cached();
  EXPECT_EQ(pool.stats().reserved_bytes, 0u);
  EXPECT_TRUE(system.live.empty());
  EXPECT_EQ(system.allocs, system.frees);
}
