// `mpirun -np 2 precis train CONFIG` on two GPUs (NCCL) under ZeRO-1 with the fused gather
// (distributed.fused_gather: the optimizer stores into both ranks' parameters, a barrier kernel
// after it): it trains and says the gather is fused; and a rank that hangs mid-training makes
// the other exit within the timeout with the watchdog's error, the communicator holding
// symmetric windows and a device communicator as it is aborted, at a step's start and between
// its optimizer and its barrier. Skipped, with the reason, on a
// machine without two GPUs or without MPI.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>

#include "core/gpu.h"
#include "support/cli.h"

namespace fs = std::filesystem;
using precis::testing::run_command;
using precis::testing::write_tiny_config;

namespace {

// The launch of two ranks on GPUs 0 and 1, ZeRO-1 with the fused gather, `extra` settings after.
std::string two_gpu_train(const fs::path& dir, const std::string& env, const std::string& extra) {
#ifdef PRECIS_MPIEXEC
  return "env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 " + env + " " +
         std::string(PRECIS_MPIEXEC) + " --bind-to none -np 2 " + PRECIS_CLI_PATH + " train " +
         (dir / "tiny.yaml").string() + " device=cuda distributed.zero=1 distributed.fused_gather=true " + extra;
#else
  (void)dir, (void)env, (void)extra;
  return "";
#endif
}

}  // namespace

#define SKIP_WITHOUT_TWO_GPUS_AND_MPI()                                                                         \
  do {                                                                                                          \
    if (precis::cuda_device_count() < 2)                                                                        \
      GTEST_SKIP() << "needs two GPUs (" << precis::cuda_device_count() << " usable: " << precis::cuda_status() \
                   << ")";                                                                                      \
    if (two_gpu_train(fs::path(), "", "").empty()) GTEST_SKIP() << "this build has no MPI to launch with";      \
  } while (0)

TEST(TrainMpirunGpu, TwoRanksTrainWithTheFusedGather) {
  SKIP_WITHOUT_TWO_GPUS_AND_MPI();
  fs::path dir = write_tiny_config("mpirun_gpu_fused");
  auto r = run_command(two_gpu_train(dir, "", ""));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("data parallel: 2 ranks (nccl)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("(fused gather)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("step 4/4"), std::string::npos) << r.output;
}

TEST(TrainMpirunGpu, ARankThatHangsMidTrainingMakesTheOtherExitNamingIt) {
  SKIP_WITHOUT_TWO_GPUS_AND_MPI();
  fs::path dir = write_tiny_config("mpirun_gpu_hang");
  // Rank 1 stops itself (SIGSTOP) as it begins step 3 of 20, after two fused steps with rank 0.
  const auto start = std::chrono::steady_clock::now();
  auto r = run_command(two_gpu_train(dir, "PRECIS_FAULT_STOP=1:3", "distributed.timeout_s=2 max_steps=20"));
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_LT(seconds, 40.0) << "2 s of timeout, 5 s for the other ranks' answers, the job's end, NCCL's start";
  EXPECT_NE(r.output.find("(fused gather)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("PRECIS_FAULT_STOP: rank 1 stops itself at step 3"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("did not complete within 2 s"), std::string::npos) << r.output;
}

TEST(TrainMpirunGpu, ARankThatHangsBeforeItsGatherLeavesNoBarrierKernelWaiting) {
  SKIP_WITHOUT_TWO_GPUS_AND_MPI();
  fs::path dir = write_tiny_config("mpirun_gpu_hang_gather");
  // Rank 1 queues step 3's optimizer (its stores into rank 0's parameters) and stops before
  // its barrier: rank 0's barrier kernel waits for it, ahead of everything rank 0 queues after.
  // Rank 0's watchdog ends the run; the barrier kernel must let go (PeerMemory::abort) for its
  // communicator's abort and its exit not to wait forever. Eager steps: the stop falls between
  // the two launches (a replayed graph would queue both at once).
  const auto start = std::chrono::steady_clock::now();
  auto r = run_command(
      two_gpu_train(dir, "PRECIS_FAULT_STOP=1:3:gather", "distributed.timeout_s=2 max_steps=20 cuda_graphs=false"));
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_LT(seconds, 40.0) << "2 s of timeout, 5 s for the other ranks' answers, the job's end, NCCL's start";
  EXPECT_NE(r.output.find("(fused gather)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("PRECIS_FAULT_STOP: rank 1 stops itself at step 3 before its gather"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("did not complete within 2 s"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("Rank 1 did not answer within 5 s"), std::string::npos) << r.output;
}
