// `mpirun -np 2 precis train CONFIG` end to end on the CPU (MPI backend): it trains,
// rank 0 alone prints the log, and the data-parallel header says so; a rank that
// fails alone at the start ends the job at once, and one that hangs mid-training makes the other
// exit with an error naming it within distributed.timeout_s. A torchrun-style
// launch of a CPU run is a clear error (the MPI backend needs an MPI launcher).
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>

#include "support/cli.h"

namespace fs = std::filesystem;
using precis::testing::run_command;
using precis::testing::write_tiny_config;

namespace {

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

}  // namespace

TEST(TrainMpirun, TwoRanksTrainAndRankZeroAlonePrints) {
#ifndef PRECIS_MPIEXEC
  GTEST_SKIP() << "this build has no MPI (cmake found none), so there is no mpirun to launch with";
#else
  fs::path dir = write_tiny_config("mpirun");
  auto r = run_command("env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 " +
                       std::string(PRECIS_MPIEXEC) + " -np 2 --oversubscribe " + PRECIS_CLI_PATH + " train " +
                       (dir / "tiny.yaml").string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(count(r.output, "data parallel: 2 ranks (mpi)"), 1u) << r.output;
  EXPECT_EQ(count(r.output, "precis: GPT-2"), 1u) << r.output;
  EXPECT_EQ(count(r.output, "step 2/4"), 1u) << r.output;
  EXPECT_EQ(count(r.output, "step 4/4"), 1u) << r.output;
  EXPECT_EQ(count(r.output, "comm_exposed"), 2u) << r.output;
  EXPECT_EQ(count(r.output, "---- sample"), 1u) << r.output;
  EXPECT_TRUE(fs::exists(dir / "out" / "metrics.jsonl"));
#endif
}

// The fused gather needs GPUs that store into each other's memory: on the MPI backend asking
// for it (true) is a note and the all-gather, auto gives way quietly. Both train.
TEST(TrainMpirun, TheFusedGatherAskedForIsANoteOnTheCpuAndAutoIsQuiet) {
#ifndef PRECIS_MPIEXEC
  GTEST_SKIP() << "this build has no MPI (cmake found none), so there is no mpirun to launch with";
#else
  for (const std::string setting : {"true", "auto"}) {
    fs::path dir = write_tiny_config("mpirun_fused_" + setting);
    auto r = run_command("env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 " +
                         std::string(PRECIS_MPIEXEC) + " -np 2 --oversubscribe " + PRECIS_CLI_PATH + " train " +
                         (dir / "tiny.yaml").string() + " distributed.zero=1 distributed.fused_gather=" + setting);
    ASSERT_EQ(r.exit_code, 0) << setting << "\n" << r.output;
    EXPECT_EQ(count(r.output, "step 4/4"), 1u) << setting << "\n" << r.output;
    EXPECT_EQ(count(r.output, "(fused gather)"), 0u) << setting << "\n" << r.output;
    const size_t notes = count(r.output, "note: distributed.fused_gather: not used: the mpi backend");
    EXPECT_EQ(notes, setting == "true" ? 1u : 0u) << setting << "\n" << r.output;
  }
#endif
}

// A rank that fails with an error ends the job at once (MPI_Abort after its error), not after the
// others' collectives time out: rank 0 would otherwise wait the whole distributed.timeout_s (60 s
// here) for it, and the failing rank in MPI_Finalize with it.
TEST(TrainMpirun, ARankThatFailsEndsTheJobAtOnce) {
#ifndef PRECIS_MPIEXEC
  GTEST_SKIP() << "this build has no MPI (cmake found none), so there is no mpirun to launch with";
#else
  fs::path dir = write_tiny_config("mpirun_fault");
  const std::string train =
      std::string(PRECIS_CLI_PATH) + " train " + (dir / "tiny.yaml").string() + " distributed.timeout_s=60";
  // Rank 1 (the second program of the MPMD launch) fails at the start: its out_dir cannot be made.
  const auto start = std::chrono::steady_clock::now();
  auto r = run_command("env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 " +
                       std::string(PRECIS_MPIEXEC) + " --oversubscribe -np 1 " + train + " : -np 1 " + train +
                       " out_dir=/proc/precis_cannot_write_here");
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_LT(seconds, 30.0) << "the job ends well before rank 0's 60 s timeout:\n" << r.output;
  EXPECT_NE(r.output.find("error: rank 1 of 2: out_dir: cannot create '/proc/precis_cannot_write_here'"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("did not complete within"), std::string::npos) << "no rank waited out its timeout:\n"
                                                                         << r.output;
#endif
}

TEST(TrainMpirun, ARankThatHangsMidTrainingMakesTheOtherExitNamingIt) {
#ifndef PRECIS_MPIEXEC
  GTEST_SKIP() << "this build has no MPI (cmake found none), so there is no mpirun to launch with";
#else
  fs::path dir = write_tiny_config("mpirun_hang");
  // Rank 1 stops itself (SIGSTOP: alive, answering nothing) as it begins step 3 of 20
  // (PRECIS_FAULT_STOP), after two steps of collectives with rank 0.
  const auto start = std::chrono::steady_clock::now();
  auto r = run_command(
      "env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 "
      "PRECIS_FAULT_STOP=1:3 " +
      std::string(PRECIS_MPIEXEC) + " --oversubscribe -np 2 " + PRECIS_CLI_PATH + " train " +
      (dir / "tiny.yaml").string() + " distributed.timeout_s=2 max_steps=20");
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_LT(seconds, 25.0) << "2 s of timeout, 5 s for the other ranks' answers, 5 s before the job is ended";
  EXPECT_NE(r.output.find("step  2/20"), std::string::npos) << "the ranks trained together first:\n" << r.output;
  EXPECT_NE(r.output.find("PRECIS_FAULT_STOP: rank 1 stops itself at step 3"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("did not complete within 2 s"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("Rank 1 did not answer within 5 s"), std::string::npos) << r.output;
#endif
}

// The fault point between a rank's optimizer and its gather (PRECIS_FAULT_STOP=R:S:gather):
// under ZeRO-1 rank 0 then waits in step 3's all-gather of the updated parameters.
TEST(TrainMpirun, ARankThatHangsBeforeItsGatherMakesTheOtherExitNamingIt) {
#ifndef PRECIS_MPIEXEC
  GTEST_SKIP() << "this build has no MPI (cmake found none), so there is no mpirun to launch with";
#else
  fs::path dir = write_tiny_config("mpirun_hang_gather");
  auto r = run_command(
      "env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 "
      "PRECIS_FAULT_STOP=1:3:gather " +
      std::string(PRECIS_MPIEXEC) + " --oversubscribe -np 2 " + PRECIS_CLI_PATH + " train " +
      (dir / "tiny.yaml").string() + " distributed.zero=1 distributed.timeout_s=2 max_steps=20");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("PRECIS_FAULT_STOP: rank 1 stops itself at step 3 before its gather"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("all_gather #"), std::string::npos) << "rank 0 waits in the gather:\n" << r.output;
  EXPECT_NE(r.output.find("did not complete within 2 s"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("Rank 1 did not answer within 5 s"), std::string::npos) << r.output;
#endif
}

TEST(TrainMpirun, TorchrunStyleCpuRunNeedsAnMpiLauncher) {
  fs::path dir = write_tiny_config("torchrun_cpu");
  auto r = run_command("env RANK=0 WORLD_SIZE=2 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=29511 " +
                       std::string(PRECIS_CLI_PATH) + " train " + (dir / "tiny.yaml").string());
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("mpi needs an MPI launcher"), std::string::npos) << r.output;
}
