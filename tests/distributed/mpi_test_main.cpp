// The main of the SPMD tests (test_*_mpi.cpp), which mpirun starts once per rank:
// MPI is initialized before the tests and finalized after them. Rank 0 prints the
// usual progress; the other ranks print only their failures, each marked with the
// rank. A failure on any rank fails the mpirun, hence the ctest test.
#include <gtest/gtest.h>

#include <iostream>

#include "distributed/mpi_runtime.h"

namespace {

class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (!result.failed()) return;
    std::cerr << "[rank " << rank_ << "] " << (result.file_name() ? result.file_name() : "?") << ":"
              << result.line_number() << ": " << result.summary() << std::endl;
  }

 private:
  int rank_;
};

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  precis::distributed::init_mpi();
  const int rank = precis::distributed::mpi_world_rank();
  if (rank != 0) {
    ::testing::TestEventListeners& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new RankFailurePrinter(rank));
  }
  const int failed = RUN_ALL_TESTS();
  precis::distributed::finalize_mpi();
  return failed;
}
