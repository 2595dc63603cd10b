// The watchdog of the MPI backend: with a timeout, a rank waiting for a collective that
// a peer does not join (it hangs) fails within the timeout with an error naming itself
// and the collective, instead of hanging; once the late rank joins, the collective
// given up on completes and the ranks go on together.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "distributed/mpi_process_group.h"
#include "distributed/mpi_world.h"
#include "support/errors.h"

using namespace precis;
using namespace precis::testing;  // NOLINT: the test helpers of this folder and support/
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

}  // namespace

TEST(Watchdog, RankWaitingForAHungPeerFailsWithinTheTimeout) {
  auto group = distributed::make_mpi_process_group(std::chrono::milliseconds(1000));
  const int late = group->world_size() - 1;
  Tensor values = full({4}, 1.0, DType::f32);
  if (group->rank() == late) {
    // Hangs past the others' timeout, then joins (so the test can end cleanly).
    std::this_thread::sleep_for(std::chrono::milliseconds(2500));
    group->all_reduce(values, distributed::ReduceOp::sum)->wait();
  } else {
    const auto start = Clock::now();
    const std::string message = error_of([&] { group->all_reduce(values, distributed::ReduceOp::sum)->wait(); });
    const double waited = seconds_since(start);
    EXPECT_GE(waited, 1.0);
    EXPECT_LT(waited, 2.0) << "the error must come at the timeout, not when the late rank joins";
    EXPECT_NE(message.find("mpi: rank " + std::to_string(group->rank()) + ": all_reduce did not complete within 1 s"),
              std::string::npos)
        << message;
    EXPECT_NE(message.find("another rank died, hangs"), std::string::npos) << message;
  }
  // No timeout here: the late all_reduce meets the one given up on, and every rank is in step again.
  mpi_world().barrier();
  Tensor after = full({1}, 1.0, DType::f32);
  group->all_reduce(after, distributed::ReduceOp::sum)->wait();
  EXPECT_EQ(after.to_vector<float>()[0], static_cast<float>(group->world_size()));
}

TEST(Watchdog, BarrierTimesOutToo) {
  auto group = distributed::make_mpi_process_group(std::chrono::milliseconds(500));
  if (group->rank() == 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    group->barrier();
  } else {
    expect_error([&] { group->barrier(); }, "barrier did not complete within 0.5 s");
  }
  mpi_world().barrier();
}
