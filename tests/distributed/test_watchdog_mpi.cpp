// The watchdog of the MPI backend: with a timeout, a rank waiting for a collective that
// a peer does not join fails soon after the timeout (the timeout, then the grace for the
// others' answers) instead of hanging, with an error naming itself, the collective and
// its sequence number, the rank that is missing (it did not answer), the ranks that timed out
// with it, and ranks waiting in another collective (a desynchronised run). Once the late
// rank joins, the collectives given up on complete and the ranks go on together.
//
// The late rank sleeps well past the others' timeout plus grace, so that on a loaded,
// oversubscribed machine the others still give up (and stop listening) before it joins.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "distributed/mpi_process_group.h"
#include "distributed/mpi_world.h"
#include "support/errors.h"

using namespace precis;
using namespace precis::testing;  // NOLINT: the test helpers of this folder and support/
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

namespace {

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// "Rank 2" or "Ranks 1, 2" (as the watchdog lists at most two ranks; up to 4 ranks here).
std::string ranks_sentence_start(const std::vector<int>& ranks) {
  std::string text = ranks.size() == 1 ? "Rank " : "Ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) text += (i ? ", " : "") + std::to_string(ranks[i]);
  return text;
}

// The ranks of the group but `a` and `b`.
std::vector<int> ranks_except(int world_size, int a, int b) {
  std::vector<int> ranks;
  for (int r = 0; r < world_size; ++r)
    if (r != a && r != b) ranks.push_back(r);
  return ranks;
}

}  // namespace

TEST(Watchdog, RankWaitingForAHungPeerFailsAndNamesTheMissingRank) {
  ASSERT_LE(mpi_world().world_size(), 4) << "the expected messages list the ranks one by one";
  auto group = distributed::make_mpi_process_group(milliseconds(1000), milliseconds(1500));
  const int late = group->world_size() - 1;
  Tensor values = full({4}, 1.0, DType::f32);
  mpi_world().barrier();
  if (group->rank() == late) {
    // Hangs past the others' timeout and grace, then joins (so the test can end cleanly).
    std::this_thread::sleep_for(milliseconds(4500));
    group->all_reduce(values, distributed::ReduceOp::sum)->wait();
  } else {
    const auto start = Clock::now();
    const std::string message = error_of([&] { group->all_reduce(values, distributed::ReduceOp::sum)->wait(); });
    const double waited = seconds_since(start);
    EXPECT_GE(waited, 2.5) << "the timeout, then the whole grace: the late rank never answers";
    EXPECT_LT(waited, 4.0) << "the error must come after the grace, not when the late rank joins";
    const int rank = group->rank();
    EXPECT_TRUE(contains(message, "mpi: rank " + std::to_string(rank) + " of " + std::to_string(group->world_size()) +
                                      ": all_reduce #1 did not complete within 1 s (distributed.timeout_s"))
        << message;
    EXPECT_TRUE(contains(message, "Rank " + std::to_string(late) +
                                      " did not answer within 1.5 s: it died, hangs, or is busy outside the "
                                      "collectives; see its output"))
        << message;
    const std::vector<int> waiting = ranks_except(group->world_size(), rank, late);
    if (!waiting.empty()) {
      EXPECT_TRUE(contains(message, ranks_sentence_start(waiting) + " timed out in all_reduce #1 too.")) << message;
    }
    EXPECT_FALSE(contains(message, "wait in different collectives")) << message;
  }
  // No timeout here: the late all_reduce meets the one given up on, and every rank is in step again.
  mpi_world().barrier();
  Tensor after = full({1}, 1.0, DType::f32);
  group->all_reduce(after, distributed::ReduceOp::sum)->wait();
  EXPECT_EQ(after.to_vector<float>()[0], static_cast<float>(group->world_size()));
}

TEST(Watchdog, RanksWaitingInDifferentCollectivesAreReportedWithTheirSequenceNumbers) {
  if (mpi_world().world_size() < 3) GTEST_SKIP() << "needs a rank ahead, one behind and one missing (np >= 3)";
  ASSERT_LE(mpi_world().world_size(), 4) << "the expected messages list the ranks one by one";
  auto group = distributed::make_mpi_process_group(milliseconds(1000), milliseconds(1500));
  // Rank 0 runs one collective ahead: it starts all_reduce #1 without waiting for it and
  // waits in #2. The missing rank starts neither before the others gave up, so rank 0
  // times out in #2 and the ranks between in #1.
  const int ahead = 0, missing = group->world_size() - 1, rank = group->rank();
  Tensor first = full({4}, 1.0, DType::f32), second = full({4}, 1.0, DType::f32);
  mpi_world().barrier();
  if (rank == missing) {
    std::this_thread::sleep_for(milliseconds(4500));
    auto w1 = group->all_reduce(first, distributed::ReduceOp::sum);
    auto w2 = group->all_reduce(second, distributed::ReduceOp::sum);
    mpi_world().barrier();
    w1->wait();
    w2->wait();
  } else if (rank == ahead) {
    auto w1 = group->all_reduce(first, distributed::ReduceOp::sum);
    const std::string message = error_of([&] { group->all_reduce(second, distributed::ReduceOp::sum)->wait(); });
    EXPECT_TRUE(contains(message, ": all_reduce #2 did not complete within 1 s")) << message;
    EXPECT_TRUE(contains(message, "Rank " + std::to_string(missing) + " did not answer within 1.5 s")) << message;
    const std::vector<int> behind = ranks_except(group->world_size(), ahead, missing);
    EXPECT_TRUE(
        contains(message, ranks_sentence_start(behind) + " timed out in all_reduce #1, this rank in all_reduce #2."))
        << message;
    EXPECT_TRUE(contains(message, "The ranks wait in different collectives")) << message;
    mpi_world().barrier();
    w1->wait();  // the missing rank has started both: #1 completes (and #2, given up on, in MPI)
  } else {
    const std::string message = error_of([&] { group->all_reduce(first, distributed::ReduceOp::sum)->wait(); });
    EXPECT_TRUE(contains(message, ": all_reduce #1 did not complete within 1 s")) << message;
    EXPECT_TRUE(contains(message, "Rank " + std::to_string(missing) + " did not answer within 1.5 s")) << message;
    EXPECT_TRUE(contains(message, "Rank 0 timed out in all_reduce #2, this rank in all_reduce #1.")) << message;
    const std::vector<int> with_me = ranks_except(group->world_size(), rank, missing);
    std::vector<int> also_behind;
    for (int r : with_me)
      if (r != ahead) also_behind.push_back(r);
    if (!also_behind.empty()) {
      EXPECT_TRUE(contains(message, ranks_sentence_start(also_behind) + " timed out in all_reduce #1 too.")) << message;
    }
    EXPECT_TRUE(contains(message, "The ranks wait in different collectives")) << message;
    mpi_world().barrier();
    group->all_reduce(second, distributed::ReduceOp::sum)->wait();  // rank 0's #2, which the missing rank started
  }
  mpi_world().barrier();
  Tensor after = full({1}, 1.0, DType::f32);
  group->all_reduce(after, distributed::ReduceOp::sum)->wait();
  EXPECT_EQ(after.to_vector<float>()[0], static_cast<float>(group->world_size()));
  if (rank == ahead || rank == missing) {
    EXPECT_EQ(first.to_vector<float>()[0], static_cast<float>(group->world_size()));
  }
}

TEST(Watchdog, BarrierTimesOutToo) {
  auto group = distributed::make_mpi_process_group(milliseconds(500), milliseconds(500));
  mpi_world().barrier();
  if (group->rank() == 0) {
    std::this_thread::sleep_for(milliseconds(2500));
    group->barrier();
  } else {
    const std::string message = error_of([&] { group->barrier(); });
    EXPECT_TRUE(contains(message, "barrier #1 did not complete within 0.5 s")) << message;
    EXPECT_TRUE(contains(message, "Rank 0 did not answer within 0.5 s")) << message;
  }
  mpi_world().barrier();
}
