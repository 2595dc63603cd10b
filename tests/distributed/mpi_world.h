// The MPI process group the SPMD tests (test_*_mpi.cpp) share: every rank of the mpirun.
#pragma once

#include <memory>

#include "distributed/mpi_process_group.h"

namespace precis::testing {

inline const std::shared_ptr<distributed::ProcessGroup>& mpi_world_group() {
  static const std::shared_ptr<distributed::ProcessGroup> group = distributed::make_mpi_process_group();
  return group;
}
inline distributed::ProcessGroup& mpi_world() { return *mpi_world_group(); }

// `value` summed over the ranks.
inline int64_t sum_over_ranks(int64_t value) {
  Tensor t = from_vector<int64_t>({value}, {1});
  mpi_world().all_reduce(t, distributed::ReduceOp::sum)->wait();
  return t.to_vector<int64_t>()[0];
}

}  // namespace precis::testing
