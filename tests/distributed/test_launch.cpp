// Reading the launcher's variables: each launcher, the single-process default,
// and the errors for inconsistent settings; the backend choice.
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "distributed/launch.h"
#include "support/errors.h"

using namespace precis;
using precis::testing::expect_error;
using namespace precis::distributed;

namespace {

using Env = std::map<std::string, std::string>;

LaunchInfo detect(const Env& env) {
  return detect_launch([&env](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  });
}

void expect_launch(const LaunchInfo& info, Launcher launcher, int rank, int world_size, int local_rank) {
  EXPECT_EQ(info.launcher, launcher) << launcher_name(info.launcher);
  EXPECT_EQ(info.rank, rank);
  EXPECT_EQ(info.world_size, world_size);
  EXPECT_EQ(info.local_rank, local_rank);
}

}  // namespace

TEST(Launch, NoVariablesMeanOneProcess) {
  LaunchInfo info = detect({});
  expect_launch(info, Launcher::none, 0, 1, 0);
  EXPECT_FALSE(info.distributed());
  EXPECT_FALSE(info.launched_by_mpi());
}

TEST(Launch, OpenMpiMpirun) {
  LaunchInfo info =
      detect({{"OMPI_COMM_WORLD_RANK", "5"}, {"OMPI_COMM_WORLD_SIZE", "8"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}});
  expect_launch(info, Launcher::mpirun, 5, 8, 1);
  EXPECT_TRUE(info.launched_by_mpi());
  EXPECT_FALSE(info.has_master_endpoint());
}

TEST(Launch, PmiWithMpichsLocalRank) {
  expect_launch(detect({{"PMI_RANK", "2"}, {"PMI_SIZE", "4"}, {"MPI_LOCALRANKID", "0"}}), Launcher::pmi, 2, 4, 0);
}

TEST(Launch, SrunButNotABatchScriptAlone) {
  Env srun = {{"SLURM_PROCID", "3"}, {"SLURM_NTASKS", "4"}, {"SLURM_LOCALID", "3"}, {"SLURM_STEP_ID", "0"}};
  expect_launch(detect(srun), Launcher::slurm, 3, 4, 3);
  Env batch_script = srun;
  batch_script.erase("SLURM_STEP_ID");
  expect_launch(detect(batch_script), Launcher::none, 0, 1, 0);
}

TEST(Launch, TorchrunStyleWithTheMasterEndpoint) {
  LaunchInfo info = detect(
      {{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "1"}, {"MASTER_ADDR", "node7"}, {"MASTER_PORT", "29500"}});
  expect_launch(info, Launcher::torchrun, 1, 2, 1);
  EXPECT_TRUE(info.has_master_endpoint());
  EXPECT_EQ(info.master_addr, "node7");
  EXPECT_EQ(info.master_port, 29500);
  EXPECT_FALSE(info.launched_by_mpi());
}

TEST(Launch, TorchrunInsideSrunIsTorchrun) {
  LaunchInfo info = detect({{"SLURM_PROCID", "1"},
                            {"SLURM_NTASKS", "2"},
                            {"SLURM_LOCALID", "0"},
                            {"SLURM_STEP_ID", "0"},
                            {"RANK", "13"},
                            {"WORLD_SIZE", "16"},
                            {"LOCAL_RANK", "5"},
                            {"MASTER_ADDR", "node1"},
                            {"MASTER_PORT", "29500"}});
  expect_launch(info, Launcher::torchrun, 13, 16, 5);
}

TEST(Launch, MpirunTakesPrecedenceAndAgreeingRankVariablesAreFine) {
  LaunchInfo info = detect({{"OMPI_COMM_WORLD_RANK", "1"},
                            {"OMPI_COMM_WORLD_SIZE", "2"},
                            {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                            {"RANK", "1"},
                            {"WORLD_SIZE", "2"},
                            {"SLURM_PROCID", "0"},
                            {"SLURM_NTASKS", "1"},
                            {"SLURM_STEP_ID", "3"}});
  expect_launch(info, Launcher::mpirun, 1, 2, 1);
}

TEST(Launch, InconsistentSettingsAreErrorsNamingTheVariables) {
  expect_error(
      [] {
        detect({{"RANK", "2"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "0"}});
      },
      "RANK=2 must be below WORLD_SIZE=2");
  expect_error([] { detect({{"RANK", "0"}, {"LOCAL_RANK", "0"}}); }, "RANK is set but WORLD_SIZE is not");
  expect_error(
      [] {
        detect({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "0"}, {"MASTER_PORT", "29500"}});
      },
      "MASTER_ADDR is not set");
  expect_error(
      [] {
        detect({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "0"}, {"MASTER_ADDR", "localhost"}});
      },
      "MASTER_PORT is not set");
  expect_error(
      [] {
        detect({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"}});
      },
      "set LOCAL_RANK");
  expect_error([] { detect({{"RANK", "one"}, {"WORLD_SIZE", "2"}}); }, "RANK=one is not a non-negative integer");
  expect_error([] { detect({{"MASTER_PORT", "70000"}}); }, "MASTER_PORT=70000 is not a TCP port");
  expect_error(
      [] {
        detect({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "0"}});
      },
      "OMPI_COMM_WORLD_SIZE=0 must be at least 1");
  expect_error(
      [] {
        detect({{"OMPI_COMM_WORLD_RANK", "1"},
                {"OMPI_COMM_WORLD_SIZE", "2"},
                {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                {"RANK", "0"},
                {"WORLD_SIZE", "2"}});
      },
      "RANK=0 WORLD_SIZE=2 disagree with the mpirun launcher's OMPI_COMM_WORLD_RANK=1");
}

TEST(Launch, BackendAutoPicksNcclOnGpusAndMpiOnTheCpu) {
  EXPECT_EQ(parse_backend("auto"), Backend::auto_select);
  EXPECT_EQ(parse_backend("nccl"), Backend::nccl);
  EXPECT_EQ(parse_backend("mpi"), Backend::mpi);
  expect_error([] { parse_backend("gloo"); }, "unknown backend 'gloo' (auto, nccl or mpi)");
  EXPECT_EQ(resolve_backend(Backend::auto_select, Device::cuda(0)), Backend::nccl);
  EXPECT_EQ(resolve_backend(Backend::auto_select, Device::cpu()), Backend::mpi);
  expect_error([] { resolve_backend(Backend::nccl, Device::cpu()); }, "nccl reduces GPU tensors");
  expect_error([] { resolve_backend(Backend::mpi, Device::cuda(1)); }, "mpi reduces CPU tensors");
}

TEST(Launch, EachRankTakesTheGpuOfItsLocalRank) {
  LaunchInfo info =
      detect({{"OMPI_COMM_WORLD_RANK", "5"}, {"OMPI_COMM_WORLD_SIZE", "8"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}});
  EXPECT_EQ(rank_device(info, Device::cuda(0)), Device::cuda(1));
  EXPECT_EQ(rank_device(info, Device::cpu()), Device::cpu());
}

TEST(Launch, TheMpiBackendNeedsAnMpiLauncher) {
  LaunchInfo info = detect({{"RANK", "0"},
                            {"WORLD_SIZE", "2"},
                            {"LOCAL_RANK", "0"},
                            {"MASTER_ADDR", "localhost"},
                            {"MASTER_PORT", "29500"}});
  expect_error([&] { init_process_group(info, Backend::mpi, Device::cpu()); },
               "mpi needs an MPI launcher (mpirun or srun)");
}
