// Bucket assignment as a pure function of the flat buffers' layout: sizes,
// reverse registration order, contiguous slices, one dtype per bucket; ZeRO-1's buckets
// tile each buffer in aligned multiples of the world size, parameters cut between them.
#include <gtest/gtest.h>

#include "distributed/buckets.h"
#include "nn/flat_parameters.h"
#include "nn/linear.h"
#include "support/errors.h"

using namespace precis;
using distributed::assign_buckets;
using distributed::BucketSizes;
using distributed::BufferLayout;
using precis::testing::expect_error;

namespace {

// Slots of the given sizes laid one after another (no alignment gaps).
BufferLayout packed(DType dtype, const std::vector<int64_t>& numels) {
  BufferLayout layout{dtype, {}};
  int64_t offset = 0;
  for (int64_t n : numels) {
    layout.slots.push_back({offset, n});
    offset += n;
  }
  return layout;
}

std::vector<std::vector<size_t>> slots_of(const std::vector<distributed::Bucket>& buckets) {
  std::vector<std::vector<size_t>> out;
  for (const auto& b : buckets) out.push_back(b.slots);
  return out;
}

}  // namespace

TEST(Buckets, FirstBucketSmallThenLargeFilledFromTheLastParameter) {
  // f32 slots of 100 elements = 400 bytes each; first bucket closes at 800 bytes, the others at 1200.
  BufferLayout layout = packed(DType::f32, std::vector<int64_t>(8, 100));
  auto buckets = assign_buckets({layout}, BucketSizes{800, 1200});
  EXPECT_EQ(slots_of(buckets), (std::vector<std::vector<size_t>>{{7, 6}, {5, 4, 3}, {2, 1, 0}}));
  ASSERT_EQ(buckets.size(), 3u);
  EXPECT_EQ(buckets[0].begin, 600);
  EXPECT_EQ(buckets[0].end, 800);
  EXPECT_EQ(buckets[1].begin, 300);
  EXPECT_EQ(buckets[1].end, 600);
  EXPECT_EQ(buckets[2].begin, 0);
  EXPECT_EQ(buckets[2].end, 300);
}

TEST(Buckets, ABucketClosesOnceItReachesTheLimitAndTheRestFormTheLast) {
  // Limits in bytes of f64 (8 each): slot sizes 10, 50, 5, 5, 30 elements.
  BufferLayout layout = packed(DType::f64, {10, 50, 5, 5, 30});
  auto buckets = assign_buckets({layout}, BucketSizes{8 * 30, 8 * 40});
  // 30 (slot 4) reaches 30 at once; then 5 + 5 + 50 = 60 >= 40 closes; slot 0 is left over.
  EXPECT_EQ(slots_of(buckets), (std::vector<std::vector<size_t>>{{4}, {3, 2, 1}, {0}}));
}

TEST(Buckets, AParameterLargerThanTheLimitIsABucketOfItsOwn) {
  BufferLayout layout = packed(DType::f32, {10, 1000, 10});
  auto buckets = assign_buckets({layout}, BucketSizes{4 * 10, 4 * 100});
  EXPECT_EQ(slots_of(buckets), (std::vector<std::vector<size_t>>{{2}, {1}, {0}}));
}

TEST(Buckets, EachBucketHoldsOneBufferSoOneDtypeAndSkipsNonFloatingBuffers) {
  std::vector<BufferLayout> layouts = {packed(DType::f32, {100, 100}), packed(DType::i64, {4}),
                                       packed(DType::f64, {50, 50, 50})};
  auto buckets = assign_buckets(layouts, BucketSizes{1 << 20, 1 << 20});
  ASSERT_EQ(buckets.size(), 2u);
  EXPECT_EQ(buckets[0].buffer, 0u);
  EXPECT_EQ(buckets[0].slots, (std::vector<size_t>{1, 0}));
  EXPECT_EQ(buckets[1].buffer, 2u);
  EXPECT_EQ(buckets[1].slots, (std::vector<size_t>{2, 1, 0}));
  EXPECT_EQ(buckets[1].end, 150);
}

TEST(Buckets, BucketsOfAFlatModelAreContiguousSlicesCoveringEveryParameter) {
  nn::Linear a(30, 20);  // 600 + 20 parameters
  auto flat = nn::flatten_parameters(a);
  auto layouts = distributed::layout_of(*flat);
  ASSERT_EQ(layouts.size(), 1u);
  EXPECT_EQ(layouts[0].grad_dtype, DType::f32);
  auto buckets = assign_buckets(layouts, BucketSizes{4 * 20, 4 * 1000});
  ASSERT_EQ(buckets.size(), 2u);
  const auto& slots = flat->buffers()[0].slots;
  EXPECT_EQ(buckets[0].slots, std::vector<size_t>{1});  // the bias, registered last
  EXPECT_EQ(buckets[0].begin, slots[1].offset);
  EXPECT_EQ(buckets[0].end, slots[1].offset + 20);
  EXPECT_EQ(buckets[1].begin, 0);
  EXPECT_EQ(buckets[1].end, 600);
}

TEST(Buckets, SizesMustBePositive) {
  expect_error([] { assign_buckets({}, BucketSizes{0, 100}); }, "bucket sizes must be positive");
}

TEST(ShardBuckets, TileTheBufferFromItsEndInWorldSizeMultiplesOfTheAlignment) {
  // f32 slots of 100 elements, 800 in all, alignment 16, 2 ranks: granule 32 elements.
  BufferLayout layout = packed(DType::f32, std::vector<int64_t>(8, 100));
  layout.numel = 800;
  layout.alignment = 16;
  // First bucket 600 bytes = 150 elements -> 160; then 1200 bytes = 300 -> 320; the rest 320.
  auto buckets = distributed::assign_shard_buckets({layout}, BucketSizes{600, 1200}, 2);
  ASSERT_EQ(buckets.size(), 3u);
  EXPECT_EQ(buckets[0].begin, 640);
  EXPECT_EQ(buckets[0].end, 800);
  EXPECT_EQ(buckets[1].begin, 320);
  EXPECT_EQ(buckets[1].end, 640);
  EXPECT_EQ(buckets[2].begin, 0);
  EXPECT_EQ(buckets[2].end, 320);
  // Slots 6 (600..699) and 3 (300..399) straddle a boundary: each is in both buckets it touches.
  EXPECT_EQ(slots_of(buckets), (std::vector<std::vector<size_t>>{{7, 6}, {6, 5, 4, 3}, {3, 2, 1, 0}}));
}

TEST(ShardBuckets, APaddingOnlyBucketHasNoSlotsAndABadSizeIsAnError) {
  BufferLayout layout = packed(DType::f64, {10});
  layout.numel = 64;
  layout.alignment = 8;
  // 2 ranks, granule 16: buckets of at least 16 elements from the end; only the last holds slot 0.
  auto buckets = distributed::assign_shard_buckets({layout}, BucketSizes{8, 8}, 2);
  ASSERT_EQ(buckets.size(), 4u);
  for (size_t k = 0; k < 3; ++k) EXPECT_TRUE(buckets[k].slots.empty()) << k;
  EXPECT_EQ(buckets[3].slots, (std::vector<size_t>{0}));
  layout.numel = 60;
  expect_error(
      [&] {
        distributed::assign_shard_buckets({layout}, BucketSizes{8, 8}, 2);
      },
      "not a multiple of 16 (world size 2 x alignment 8)");
}
