// The fault watchdog's error text (distributed/watchdog.h), from given answers: the rank
// that is missing, the ranks waiting with this one, ranks in other collectives, and the
// case where the other ranks cannot be asked (no MPI in this process, as under a
// torchrun-style launch). The MPI side channel itself: test_watchdog_mpi.cpp.
#include <gtest/gtest.h>

#include "core/error.h"
#include "distributed/watchdog.h"

using namespace precis::distributed;
using std::chrono::milliseconds;

namespace {

std::string message(const PeerAnswers& answers, int world_size = 8) {
  return timeout_message("nccl", 3, world_size, {"all_reduce", 40}, milliseconds(30000), milliseconds(5000), answers);
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

}  // namespace

TEST(WatchdogMessage, NamesTheSilentRankAndTheRanksWaitingTooWithRuns) {
  PeerAnswers answers;
  answers.silent = {5};
  for (int r : {0, 1, 2, 4, 6, 7}) answers.waiting[r] = {"all_reduce", 40};
  const std::string text = message(answers);
  EXPECT_TRUE(contains(text,
                       "nccl: rank 3 of 8: all_reduce #40 did not complete within 30 s (distributed.timeout_s; "
                       "#40 counts this process group's collectives)."))
      << text;
  EXPECT_TRUE(contains(text,
                       " Rank 5 did not answer within 5 s: it died, hangs, or is busy outside the collectives; "
                       "see its output for an error."))
      << text;
  EXPECT_TRUE(contains(text, " Ranks 0-2, 4, 6, 7 timed out in all_reduce #40 too.")) << text;
  EXPECT_FALSE(contains(text, "wait in different collectives")) << text;
  EXPECT_FALSE(contains(text, "Every rank")) << text;
}

TEST(WatchdogMessage, SeveralSilentRanks) {
  PeerAnswers answers;
  answers.silent = {0, 1};
  answers.waiting[2] = {"all_reduce", 40};
  const std::string text = message(answers, 4);
  EXPECT_TRUE(contains(text,
                       " Ranks 0, 1 did not answer within 5 s: they died, hang, or are busy outside the "
                       "collectives; see their output"))
      << text;
  EXPECT_TRUE(contains(text, " Rank 2 timed out in all_reduce #40 too.")) << text;
}

TEST(WatchdogMessage, RanksInOtherCollectivesAreGroupedByWhereTheyWait) {
  PeerAnswers answers;
  answers.waiting[0] = {"all_reduce", 41};
  answers.waiting[1] = {"all_reduce", 41};
  answers.waiting[2] = {"broadcast", 40};
  const std::string text = message(answers, 4);
  EXPECT_TRUE(contains(text, " Rank 2 timed out in broadcast #40, this rank in all_reduce #40.")) << text;
  EXPECT_TRUE(contains(text, " Ranks 0, 1 timed out in all_reduce #41, this rank in all_reduce #40.")) << text;
  EXPECT_TRUE(contains(text,
                       " The ranks wait in different collectives: unless a rank started one before waiting for an "
                       "earlier one, a collective was skipped or added on some rank"))
      << text;
  EXPECT_FALSE(contains(text, "did not answer")) << text;
}

TEST(WatchdogMessage, EveryRankWaitingInTheSameCollectiveBlamesTheTransport) {
  PeerAnswers answers;
  answers.waiting[0] = {"all_reduce", 40};
  const std::string text = message(answers, 2);
  EXPECT_TRUE(contains(text,
                       " Rank 0 timed out in all_reduce #40 too. Every rank timed out in it: the collective "
                       "itself is stuck"))
      << text;
}

TEST(WatchdogMessage, WithoutMpiTheMissingRankCannotBeNamedAndTheErrorSaysWhy) {
  // This test's process never initializes MPI: the watchdog has no side channel, as under
  // a torchrun-style launch (or in a build without MPI), and says so without waiting.
  Watchdog watchdog("nccl", 1, 2, milliseconds(1000), milliseconds(60000));
  const auto start = std::chrono::steady_clock::now();
  std::string text;
  try {
    watchdog.fail({"all_gather", 7});
  } catch (const precis::Error& e) {
    text = e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10)) << "no grace without a channel";
  EXPECT_TRUE(contains(text, "nccl: rank 1 of 2: all_gather #7 did not complete within 1 s")) << text;
  EXPECT_TRUE(contains(text, "The rank that is missing cannot be named: this ")) << text;
  EXPECT_TRUE(contains(text,
                       "the watchdog asks the other ranks over MPI. Another rank died, hangs, or stopped "
                       "calling the same collectives; see the other ranks' output"))
      << text;
}
