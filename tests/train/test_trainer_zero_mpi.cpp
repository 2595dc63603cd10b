// The Trainer under ZeRO-1 (distributed.zero: 1, MPI backend, CPU), run by mpirun on N
// ranks: it trains as plain DDP does (the same losses and parameters to f32 round-off,
// gradients clipped on every step, with and without accumulation, and with the gradients
// reduced in bf16, which ZeRO-1's optimizer reads in bf16); each rank holds
// about 1/N of the optimizer state and says so at the start; a checkpoint it writes
// holds the whole state, so it resumes under zero 0, under zero 1 and in one process;
// distributed.gather_overlap (the parameters gathered behind the next forward) changes no bit.
#include <gtest/gtest.h>

#include "trainer_mpi.h"

using namespace precis;
using namespace precis::testing;  // NOLINT: the test helpers of this folder and support/

namespace {

int rank() { return mpi_world().rank(); }
int world_size() { return mpi_world().world_size(); }

const TrainerMpiFiles files("precis_trainer_zero");

// The tiny config with distributed.zero `zero`, its gradients clipped at every step.
train::TrainConfig config_of(const std::string& name, int64_t zero, int64_t rows, int64_t accum, int64_t steps = 4,
                             bool per_rank = false) {
  train::TrainConfig config = files.tiny_config(files.fresh_dir(name, per_rank), rows, accum, steps);
  config.distributed.zero = zero;
  config.optimizer.grad_clip = 0.05;  // the tiny model's gradient norm is above it
  config.schedule.decay_steps = 4;    // runs of 2 steps follow the 4-step schedule
  return config;
}

void expect_same_run(train::Trainer& a, train::Trainer& b, size_t first_loss = 0) {
  ASSERT_EQ(a.losses().size() + first_loss, b.losses().size());
  for (size_t i = 0; i < a.losses().size(); ++i)
    EXPECT_NEAR(a.losses()[i], b.losses()[i + first_loss], 2e-5 * std::abs(b.losses()[i + first_loss]))
        << "step " << i + first_loss + 1;
  // AdamW steps of lr <= 1e-2 move a parameter by about 1e-2 each; round-off stays far below.
  EXPECT_LT(max_abs_difference(parameters_of(a), parameters_of(b)), 2e-5);
}

// `grad_reduce`: the dtype the gradients are reduced in (bf16: ZeRO-1's optimizer reads the
// reduced shard in bf16, distributed/zero.h; DDP casts it back into its f32 buffer).
void expect_zero_trains_as_ddp(int64_t accum, DType grad_reduce = DType::f32) {
  train::TrainConfig zero_config = config_of("zero", 1, 2, accum), ddp_config = config_of("ddp", 0, 2, accum);
  zero_config.precision.policy.grad_reduce_dtype = ddp_config.precision.policy.grad_reduce_dtype = grad_reduce;
  train::Trainer zero(zero_config, mpi_world_group());
  zero.run();
  train::Trainer ddp(ddp_config, mpi_world_group());
  ddp.run();
  expect_same_run(zero, ddp);
  for (const train::StepReport& report : ddp.reports()) EXPECT_GT(report.grad_norm, 0.05) << "the test clips";
  ASSERT_EQ(zero.reports().size(), ddp.reports().size());
  for (size_t i = 0; i < ddp.reports().size(); ++i)
    EXPECT_NEAR(zero.reports()[i].grad_norm, ddp.reports()[i].grad_norm, 1e-5 * ddp.reports()[i].grad_norm);
  EXPECT_TRUE(same_on_every_rank(parameters_of(zero))) << "rank " << rank();
}

}  // namespace

TEST(TrainerZero1, TrainsAsDdp) { expect_zero_trains_as_ddp(/*accum=*/1); }

TEST(TrainerZero1, TrainsAsDdpWithAccumulation) { expect_zero_trains_as_ddp(/*accum=*/2); }

TEST(TrainerZero1, TrainsAsDdpWithGradientsReducedInBf16) {
  expect_zero_trains_as_ddp(/*accum=*/2, /*grad_reduce=*/DType::bf16);
}

TEST(TrainerZero1, EachRankHoldsItsShardOfTheStateAndSaysSo) {
  train::Trainer zero(config_of("state_zero", 1, 2, 1, 2), mpi_world_group());
  ::testing::internal::CaptureStdout();
  zero.run();
  const std::string out = ::testing::internal::GetCapturedStdout();
  train::Trainer ddp(config_of("state_ddp", 0, 2, 1, 2), mpi_world_group());
  ddp.run();
  const int64_t mine = zero.optimizer().state_bytes(), whole = ddp.optimizer().state_bytes();
  EXPECT_EQ(sum_over_ranks(mine), whole);
  // A shard is whole / N elements, give or take one parameter's padding to 64 bytes per rank.
  EXPECT_NEAR(static_cast<double>(mine), static_cast<double>(whole) / world_size(), 0.02 * whole);
  if (rank() == 0) {
    EXPECT_NE(out.find("optimizer state " + std::to_string(mine) + " bytes"), std::string::npos) << out;
    EXPECT_NE(out.find("of " + std::to_string(whole) + " bytes"), std::string::npos) << out;
  }
}

TEST(TrainerZero1, CheckpointResumesUnderZero0Zero1AndInOneProcess) {
  train::Trainer straight(config_of("resume_straight", 0, 2, 1), mpi_world_group());
  straight.run();
  train::Trainer first(config_of("resume_first", 1, 2, 1, 2), mpi_world_group());
  first.run();
  mpi_world().barrier();  // rank 0's checkpoint is written

  for (int64_t zero : {0, 1}) {
    train::TrainConfig config = config_of("resume_zero" + std::to_string(zero), zero, 2, 1);
    config.checkpoint.dir = first.config().checkpoint.dir;
    config.checkpoint.resume = true;
    config.checkpoint.save_final = false;  // the checkpoint stays the one of step 2
    train::Trainer resumed(config, mpi_world_group());
    resumed.run();
    SCOPED_TRACE("resumed under zero " + std::to_string(zero));
    expect_same_run(resumed, straight, /*first_loss=*/2);
  }

  // One process on the global batch: the data position is global, so it sees the same windows.
  train::TrainConfig single = config_of("resume_single", 0, 2 * world_size(), 1, 4, /*per_rank=*/true);
  single.checkpoint.dir = first.config().checkpoint.dir;
  single.checkpoint.resume = true;
  single.checkpoint.save_final = false;
  train::Trainer resumed(single, nullptr);
  resumed.run();
  expect_same_run(resumed, straight, /*first_loss=*/2);
  mpi_world().barrier();
}

// distributed.reduce_overlap=false reduce-scatters every bucket after the backward, with the
// all-gather behind the next forward (gather_overlap): the values of the default, bit for bit.
TEST(TrainerZero1, ReducingAfterTheBackwardTrainsBitForBitAsOverlapped) {
  const auto config = [](const std::string& name, bool reduce_overlap) {
    train::TrainConfig config = config_of(name, 1, 2, /*accum=*/2, 4);
    config.distributed.first_bucket_mb = config.distributed.bucket_mb = 0.002;  // several buckets of ~2 KiB
    config.distributed.gather_overlap = true;
    config.distributed.reduce_overlap = reduce_overlap;
    return config;
  };
  train::Trainer overlapped(config("reduce_overlapped", true), mpi_world_group());
  overlapped.run();
  train::Trainer after(config("reduce_after", false), mpi_world_group());
  after.run();
  EXPECT_EQ(after.losses(), overlapped.losses());
  EXPECT_EQ(parameters_of(after), parameters_of(overlapped));
  mpi_world().barrier();
}

// distributed.gather_overlap moves the parameters' all-gather behind the next step's forward;
// the values are the same, bit for bit: with accumulation, an evaluation reading pending
// parameters (step 2), a checkpoint saving them (step 3, nothing else completing the gather
// first), and runs resumed from those checkpoints.
TEST(TrainerZero1, GatherOverlapTrainsBitForBitAsWithout) {
  const auto config = [](const std::string& name, bool overlap, int64_t steps) {
    train::TrainConfig config = config_of(name, 1, 2, /*accum=*/2, steps);
    config.eval_interval = 2;
    config.checkpoint.interval = 3;
    config.checkpoint.save_final = false;
    config.distributed.gather_overlap = overlap;
    return config;
  };
  train::Trainer off(config("overlap_off", false, 4), mpi_world_group());
  off.run();
  train::Trainer on(config("overlap_on", true, 4), mpi_world_group());
  on.run();
  EXPECT_EQ(on.losses(), off.losses());
  EXPECT_EQ(parameters_of(on), parameters_of(off));
  ASSERT_EQ(on.reports().size(), off.reports().size());
  for (size_t i = 0; i < off.reports().size(); ++i) {
    ASSERT_TRUE(off.reports()[i].val_loss.has_value() == on.reports()[i].val_loss.has_value());
    if (off.reports()[i].val_loss) {
      EXPECT_EQ(*on.reports()[i].val_loss, *off.reports()[i].val_loss) << "report " << i;
    }
  }
  mpi_world().barrier();  // rank 0's checkpoints are written

  // Each resumed from its own step-3 checkpoint, under its own setting, for a step 4 and 5.
  std::vector<std::unique_ptr<train::Trainer>> resumed;
  for (const train::Trainer* run : {&off, &on}) {
    train::TrainConfig again =
        config(run == &on ? "overlap_on_resumed" : "overlap_off_resumed", run->config().distributed.gather_overlap, 5);
    again.checkpoint.dir = run->config().checkpoint.dir;
    again.checkpoint.resume = true;
    again.checkpoint.interval = 0;
    resumed.push_back(std::make_unique<train::Trainer>(again, mpi_world_group()));
    resumed.back()->run();
  }
  EXPECT_EQ(resumed[1]->losses(), resumed[0]->losses());
  EXPECT_EQ(parameters_of(*resumed[1]), parameters_of(*resumed[0]));
  ASSERT_EQ(resumed[0]->losses().size(), 2u);
  EXPECT_EQ(resumed[0]->losses()[0], off.losses()[3]) << "step 4 after the resume, as the run straight through";
  mpi_world().barrier();
}
