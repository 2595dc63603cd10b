#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <numeric>
#include <set>

#include "core/error.h"
#include "data/token_dataset.h"
#include "data/token_file.h"
#include "data/window_order.h"
#include "support/errors.h"

using namespace precis;
using precis::testing::error_of;
namespace fs = std::filesystem;

namespace {

using Rows = std::vector<std::vector<int32_t>>;

Rows rows_of(const Tensor& t) {
  std::vector<int32_t> values = t.to_vector<int32_t>();
  Rows rows(t.size(0));
  for (int64_t r = 0; r < t.size(0); ++r)
    rows[r].assign(values.begin() + r * t.size(1), values.begin() + (r + 1) * t.size(1));
  return rows;
}

// Shard k holds the tokens k*1000, k*1000+1, ...: every token says where it came from.
class TokenDatasetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("precis_test_token_dataset_" +
                                        std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::vector<std::string> write_shards(const std::vector<int32_t>& sizes) {
    std::vector<std::string> files;
    for (size_t k = 0; k < sizes.size(); ++k) {
      std::vector<int32_t> tokens(sizes[k]);
      std::iota(tokens.begin(), tokens.end(), static_cast<int32_t>(k * 1000));
      files.push_back((dir_ / ("shard_" + std::to_string(k) + ".bin")).string());
      write_token_file(files.back(), tokens);
    }
    return files;
  }

  static TokenDatasetOptions options(int64_t B, int64_t T, bool shuffle, bool prefetch, uint64_t seed = 0) {
    TokenDatasetOptions o;
    o.batch_size = B;
    o.seq_len = T;
    o.shuffle = shuffle;
    o.prefetch = prefetch;
    o.seed = seed;
    return o;
  }

  // The first token of each row of the next `n` batches: it names the window.
  static std::vector<int32_t> window_starts(TokenDataset& data, int64_t n) {
    std::vector<int32_t> starts;
    for (int64_t i = 0; i < n; ++i)
      for (const auto& row : rows_of(data.next_batch().inputs)) starts.push_back(row[0]);
    return starts;
  }

  static void expect_same_batches(TokenDataset& a, TokenDataset& b, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
      TokenBatch x = a.next_batch(), y = b.next_batch();
      ASSERT_EQ(rows_of(x.inputs), rows_of(y.inputs)) << "batch " << i;
      ASSERT_EQ(rows_of(x.targets), rows_of(y.targets)) << "batch " << i;
    }
  }

  fs::path dir_;
};

}  // namespace

TEST_F(TokenDatasetTest, SequentialWindowsAreSlicesWithTargetsShiftedByOne) {
  auto files = write_shards({14});  // (14 - 1) / 4 = 3 windows of 5 tokens
  TokenDataset data(files, options(2, 4, false, false));
  EXPECT_EQ(data.num_windows(), 3);
  EXPECT_EQ(data.num_tokens(), 14);
  TokenBatch batch = data.next_batch();
  EXPECT_EQ(batch.inputs.dtype(), DType::i32);
  EXPECT_EQ(batch.inputs.shape(), (Shape{2, 4}));
  EXPECT_TRUE(batch.inputs.is_cpu() && batch.inputs.is_contiguous() && batch.targets.is_contiguous());
  EXPECT_EQ(rows_of(batch.inputs), (Rows{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  EXPECT_EQ(rows_of(batch.targets), (Rows{{1, 2, 3, 4}, {5, 6, 7, 8}}));
  // The third window, then the stream wraps into epoch 1.
  batch = data.next_batch();
  EXPECT_EQ(rows_of(batch.inputs), (Rows{{8, 9, 10, 11}, {0, 1, 2, 3}}));
  EXPECT_EQ(rows_of(batch.targets), (Rows{{9, 10, 11, 12}, {1, 2, 3, 4}}));
  EXPECT_EQ(data.position().cursor, (WindowCursor{1, 0, 1}));
}

TEST_F(TokenDatasetTest, SequentialOrderWalksShardsInFileOrder) {
  auto files = write_shards({9, 3, 6});  // 2, 0 and 1 windows of T = 4
  TokenDataset data(files, options(1, 4, false, true));
  EXPECT_EQ(data.num_windows(), 3);
  EXPECT_EQ(window_starts(data, 4), (std::vector<int32_t>{0, 4, 2000, 0}));
}

TEST_F(TokenDatasetTest, ShuffledEpochCoversEveryWindowOnceAndIsDeterministic) {
  auto files = write_shards({101, 57, 30});  // 25 + 14 + 7 = 46 windows of T = 4
  TokenDataset data(files, options(1, 4, true, true, 42));
  ASSERT_EQ(data.num_windows(), 46);
  std::vector<int32_t> expected;
  for (int shard = 0; shard < 3; ++shard)
    for (int w = 0; w < std::vector<int>{25, 14, 7}[shard]; ++w) expected.push_back(shard * 1000 + 4 * w);

  std::vector<int32_t> epoch0 = window_starts(data, 46);
  EXPECT_EQ(data.position().cursor.epoch, 1);
  std::vector<int32_t> sorted0 = epoch0;
  std::sort(sorted0.begin(), sorted0.end());
  EXPECT_EQ(sorted0, expected);
  EXPECT_NE(epoch0, expected);  // really shuffled

  std::vector<int32_t> epoch1 = window_starts(data, 46);
  std::vector<int32_t> sorted1 = epoch1;
  std::sort(sorted1.begin(), sorted1.end());
  EXPECT_EQ(sorted1, expected);
  EXPECT_NE(epoch1, epoch0);  // a new order every epoch

  TokenDataset same(files, options(1, 4, true, false, 42));
  EXPECT_EQ(window_starts(same, 46), epoch0);
  TokenDataset other(files, options(1, 4, true, false, 43));
  EXPECT_NE(window_starts(other, 46), epoch0);
}

TEST_F(TokenDatasetTest, ShuffledRowsAreStillContiguousWindows) {
  auto files = write_shards({101, 57});
  TokenDataset data(files, options(5, 4, true, true, 7));
  for (int i = 0; i < 20; ++i) {
    TokenBatch batch = data.next_batch();
    Rows inputs = rows_of(batch.inputs), targets = rows_of(batch.targets);
    for (size_t r = 0; r < inputs.size(); ++r) {
      EXPECT_EQ(inputs[r][0] % 1000 % 4, 0) << "windows start at multiples of T";
      for (int t = 0; t < 4; ++t) {
        EXPECT_EQ(inputs[r][t], inputs[r][0] + t);
        EXPECT_EQ(targets[r][t], inputs[r][0] + t + 1);
      }
    }
  }
}

TEST_F(TokenDatasetTest, PrefetchOnAndOffGiveTheSameBatches) {
  auto files = write_shards({101, 57, 30});
  for (bool shuffle : {false, true}) {
    TokenDataset with(files, options(3, 4, shuffle, true, 5));
    TokenDataset without(files, options(3, 4, shuffle, false, 5));
    expect_same_batches(with, without, 40);  // about 2.6 epochs
    EXPECT_EQ(with.position(), without.position());
  }
}

TEST_F(TokenDatasetTest, RestoredPositionContinuesTheSameBatches) {
  auto files = write_shards({101, 57, 30});
  for (bool prefetch : {false, true}) {
    TokenDataset first(files, options(4, 4, true, prefetch, 1234));
    for (int i = 0; i < 13; ++i) first.next_batch();  // into the second epoch
    // Through JSON text, as a checkpoint stores it.
    std::string saved = first.position().to_json().dump();
    EXPECT_EQ(first.position().cursor.epoch, 1);

    TokenDataset resumed(files, options(4, 4, true, !prefetch, 1234));
    resumed.next_batch();  // a dataset that already ran must also land on the saved spot
    resumed.restore(TokenDatasetPosition::from_json(Json::parse(saved)));
    EXPECT_EQ(resumed.position(), first.position());
    expect_same_batches(first, resumed, 30);
  }
}

TEST_F(TokenDatasetTest, PositionCountsWindowsSoTheBatchSizeMayChange) {
  auto files = write_shards({101});
  TokenDataset big(files, options(6, 4, true, true, 9));
  big.next_batch();
  TokenDataset small(files, options(3, 4, true, true, 9));
  small.restore(big.position());
  std::vector<int32_t> from_big = window_starts(big, 2);
  std::vector<int32_t> from_small = window_starts(small, 4);
  EXPECT_EQ(from_big, from_small);
}

TEST_F(TokenDatasetTest, RanksSplitEachGlobalBatch) {
  auto files = write_shards({101, 57});
  TokenDataset whole(files, options(4, 4, true, false, 3));
  TokenDatasetOptions rank0 = options(2, 4, true, true, 3), rank1 = rank0;
  rank0.world_size = rank1.world_size = 2;
  rank1.rank = 1;
  TokenDataset part0(files, rank0), part1(files, rank1);
  for (int i = 0; i < 15; ++i) {
    Rows all = rows_of(whole.next_batch().inputs);
    EXPECT_EQ(rows_of(part0.next_batch().inputs), Rows(all.begin(), all.begin() + 2));
    EXPECT_EQ(rows_of(part1.next_batch().inputs), Rows(all.begin() + 2, all.end()));
  }
  EXPECT_EQ(part0.position(), whole.position());
  EXPECT_EQ(part1.position(), whole.position());
}

TEST_F(TokenDatasetTest, PositionJsonKeepsEveryField) {
  TokenDatasetPosition position{{3, 1, 17}, true, ~0ull, 1024, 987654321};
  Json json = position.to_json();
  EXPECT_EQ(json.dump(),
            R"({"epoch":3,"shard":1,"window":17,"shuffle":true,"seed":-1,"seq_len":1024,"num_windows":987654321})");
  EXPECT_EQ(TokenDatasetPosition::from_json(json), position);
  std::string message = error_of([] { TokenDatasetPosition::from_json(Json::parse(R"({"epoch":1})")); });
  EXPECT_NE(message.find("the key \"shard\" is missing"), std::string::npos) << message;
}

TEST_F(TokenDatasetTest, RestoreRejectsAPositionFromOtherData) {
  auto files = write_shards({101, 57});
  TokenDataset data(files, options(2, 4, true, true, 1));
  TokenDatasetPosition position = data.position();

  TokenDatasetPosition other_len = position;
  other_len.seq_len = 8;
  EXPECT_NE(error_of([&] { data.restore(other_len); }).find("saved for 39 windows of seq_len 8"), std::string::npos);
  TokenDatasetPosition other_seed = position;
  other_seed.seed = 2;
  EXPECT_NE(error_of([&] { data.restore(other_seed); }).find("resume with the same data order and seed"),
            std::string::npos);
  TokenDatasetPosition outside = position;
  outside.cursor.shard = 5;
  EXPECT_NE(error_of([&] { data.restore(outside); }).find("lies outside a dataset of 2 shards"), std::string::npos);
  // After the refused restores the dataset still works from where it was.
  TokenDataset fresh(files, options(2, 4, true, false, 1));
  expect_same_batches(data, fresh, 3);
}

TEST_F(TokenDatasetTest, ClearErrorsForBadSetups) {
  auto files = write_shards({5, 3});
  std::string message = error_of([&] { TokenDataset(files, options(1, 8, false, true)); });
  EXPECT_NE(message.find("hold 8 tokens in all, and no shard has the 9 tokens of one window of seq_len 8"),
            std::string::npos)
      << message;
  EXPECT_NE(error_of([&] {
              TokenDataset({(dir_ / "nope.bin").string()}, options(1, 2, false, true));
            }).find("nope.bin does not exist"),
            std::string::npos);
  EXPECT_NE(
      error_of([&] { TokenDataset(files, options(0, 2, false, true)); }).find("batch_size and seq_len must be >= 1"),
      std::string::npos);
  TokenDatasetOptions bad_rank = options(1, 2, false, true);
  bad_rank.rank = 2;
  bad_rank.world_size = 2;
  EXPECT_NE(error_of([&] { TokenDataset(files, bad_rank); }).find("rank 2 is not in [0, world_size = 2)"),
            std::string::npos);
}

TEST(WindowOrder, SeededPermutationIsAPermutationFixedBySeedAndStream) {
  std::vector<int64_t> p = seeded_permutation(1000, 11, 0);
  std::vector<int64_t> sorted = p;
  std::sort(sorted.begin(), sorted.end());
  std::vector<int64_t> identity(1000);
  std::iota(identity.begin(), identity.end(), 0);
  EXPECT_EQ(sorted, identity);
  EXPECT_NE(p, identity);
  EXPECT_EQ(seeded_permutation(1000, 11, 0), p);
  EXPECT_NE(seeded_permutation(1000, 12, 0), p);
  EXPECT_NE(seeded_permutation(1000, 11, 1), p);
  EXPECT_TRUE(seeded_permutation(0, 1, 0).empty());
}

TEST(WindowOrder, ShuffledShardsAreVisitedOneAtATime) {
  WindowOrder order({5, 5, 5}, true, 99);
  WindowCursor cursor;
  std::vector<int64_t> shards;
  for (int i = 0; i < 15; ++i) shards.push_back(order.take(cursor).shard);
  for (int block = 0; block < 3; ++block)
    for (int i = 1; i < 5; ++i) EXPECT_EQ(shards[block * 5 + i], shards[block * 5]);
  EXPECT_EQ(std::set<int64_t>(shards.begin(), shards.end()).size(), 3u);
  EXPECT_EQ(cursor, (WindowCursor{1, 0, 0}));
}

// The dataset checks its shards against the vocabulary it is given, when it opens them.
TEST(TokenDatasetVocabulary, AShardWithTooLargeTokensIsAnErrorAtOpen) {
  const std::string file = (std::filesystem::temp_directory_path() / "precis_test_dataset_vocab.bin").string();
  std::vector<int32_t> tokens(64, 5);
  tokens[40] = 100;
  write_token_file(file, tokens);
  TokenDatasetOptions options;
  options.seq_len = 4;
  options.prefetch = false;
  TokenDataset unchecked({file}, options);  // vocab_size 0: not checked
  options.vocab_size = 65;
  const std::string message = precis::testing::error_of([&] { TokenDataset dataset({file}, options); });
  EXPECT_NE(message.find("token 100 at byte offset 1104 (token 40)"), std::string::npos) << message;
}
