// What the SPMD GPU tests (test_*_mpi_gpu.cpp) share: one rank per GPU of this host,
// the launch mpirun described, this rank's GPU and the NCCL group of every rank.
#pragma once

#include <gtest/gtest.h>

#include <memory>

#include "distributed/launch.h"
#include "distributed/mpi_runtime.h"
#include "support/gpu.h"

// Every rank needs a GPU of its own on this host (the same answer on every rank).
#define SKIP_WITHOUT_A_GPU_PER_RANK()                                                                           \
  do {                                                                                                          \
    PRECIS_SKIP_WITHOUT_GPU();                                                                                  \
    if (::precis::cuda_device_count() < ::precis::distributed::mpi_world_size())                                \
      GTEST_SKIP() << ::precis::distributed::mpi_world_size() << " ranks but " << ::precis::cuda_device_count() \
                   << " GPU(s)";                                                                                \
  } while (0)

namespace precis::testing {

inline const distributed::LaunchInfo& launch() {
  static const distributed::LaunchInfo info = distributed::detect_launch();
  return info;
}
inline Device my_gpu() { return distributed::rank_device(launch(), Device::cuda()); }

// Returns once every rank has called it (through MPI, whatever the GPUs are doing).
inline void mpi_barrier() {
  int token = 0;
  distributed::mpi_broadcast_bytes(&token, sizeof token, 0);
}

// The group of the run, its unique id shared through MPI (mpirun sets no MASTER_ADDR).
inline const std::shared_ptr<distributed::ProcessGroup>& nccl_world() {
  static const std::shared_ptr<distributed::ProcessGroup> group =
      distributed::init_process_group(launch(), distributed::Backend::nccl, my_gpu());
  return group;
}

}  // namespace precis::testing
