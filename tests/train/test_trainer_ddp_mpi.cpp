// The Trainer under data parallelism (MPI backend, CPU), run by mpirun on N ranks:
// N ranks with B rows each train as one process on N*B rows (the same losses, the
// same validation loss and the same parameters on every rank, to f32 round-off),
// also with gradient accumulation (no_sync micro-steps) against one big batch;
// rank 0 alone writes metrics, checkpoints and numerics; ranks that disagree on
// the batch or the model stop at the start with an error on every rank; a checkpoint moves
// between N ranks and one process both ways.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "data/tokenize.h"
#include "support/errors.h"
#include "trainer_mpi.h"

using namespace precis;
using namespace precis::testing;  // NOLINT: the test helpers of this folder and support/
namespace fs = std::filesystem;

namespace {

int rank() { return mpi_world().rank(); }
int world_size() { return mpi_world().world_size(); }

const TrainerMpiFiles files("precis_trainer_ddp");
std::string fresh_dir(const std::string& name, bool per_rank = false) { return files.fresh_dir(name, per_rank); }
train::TrainConfig tiny_config(const std::string& out_dir, int64_t rows, int64_t accum, int64_t steps = 4) {
  return files.tiny_config(out_dir, rows, accum, steps);
}

// Data-parallel training on every rank (`rows` per rank, `accum` micro-steps) against one
// process on `reference_rows` rows and `reference_accum` micro-steps, trained by every rank alone.
void expect_same_training(int64_t rows, int64_t accum, int64_t reference_rows, int64_t reference_accum) {
  train::Trainer ddp(tiny_config(fresh_dir("ddp"), rows, accum), mpi_world_group());
  ASSERT_EQ(ddp.world_size(), world_size());
  ddp.run();
  train::Trainer reference(tiny_config(fresh_dir("reference", /*per_rank=*/true), reference_rows, reference_accum),
                           nullptr);
  ASSERT_EQ(reference.world_size(), 1);
  reference.run();

  ASSERT_EQ(ddp.losses().size(), reference.losses().size());
  for (size_t i = 0; i < ddp.losses().size(); ++i)
    EXPECT_NEAR(ddp.losses()[i], reference.losses()[i], 2e-5 * std::abs(reference.losses()[i])) << "step " << i + 1;
  // Validation batches have micro_batch rows (per rank): the same windows only for the same global micro-batch.
  if (rows * world_size() == reference_rows) {
    EXPECT_NEAR(ddp.final_val_loss(), reference.final_val_loss(), 2e-5 * reference.final_val_loss());
  }
  // Four AdamW steps of lr <= 1e-2 move a parameter by at most about 4e-2; f32 round-off in the
  // other summation order stays far below that.
  EXPECT_LT(max_abs_difference(parameters_of(ddp), parameters_of(reference)), 2e-5);
  // Every rank holds the same parameters, bit for bit: rank 0's reach the others unchanged.
  EXPECT_TRUE(same_on_every_rank(parameters_of(ddp))) << "rank " << rank();
}

}  // namespace

TEST(TrainerDdp, RanksWithBRowsTrainAsOneProcessWithNTimesB) {
  expect_same_training(/*rows=*/2, /*accum=*/1, /*reference_rows=*/2 * world_size(), /*reference_accum=*/1);
}

TEST(TrainerDdp, AccumulationUnderNoSyncEqualsTheBigBatch) {
  // Micro-step m of every rank covers windows m*B*N..(m+1)*B*N-1 of the global stream, so two
  // micro-steps on N ranks see the 2*B*N windows of one big batch.
  expect_same_training(/*rows=*/2, /*accum=*/2, /*reference_rows=*/4 * world_size(), /*reference_accum=*/1);
}

TEST(TrainerDdp, CheckpointOfNRanksResumesInOneProcessOnTheGlobalBatch) {
  // N ranks for 4 steps, against N ranks for 2 steps whose checkpoint one process on N*B rows
  // resumes for the last 2: the data position is global, so the resumed run sees the same windows.
  train::TrainConfig straight_config = tiny_config(fresh_dir("resume_straight"), 2, 1, 4);
  straight_config.schedule.decay_steps = 4;
  train::Trainer straight(straight_config, mpi_world_group());
  straight.run();

  train::TrainConfig first_config = tiny_config(fresh_dir("resume_first"), 2, 1, 2);
  first_config.schedule.decay_steps = 4;  // the schedule of the 4-step run
  train::Trainer first(first_config, mpi_world_group());
  first.run();
  mpi_world().barrier();  // rank 0's checkpoint is written

  train::TrainConfig resumed_config =
      tiny_config(fresh_dir("resume_single", /*per_rank=*/true), 2 * world_size(), 1, 4);
  resumed_config.schedule.decay_steps = 4;
  resumed_config.checkpoint.dir = first.config().checkpoint.dir;
  resumed_config.checkpoint.resume = true;
  resumed_config.checkpoint.save_final = false;  // every rank reads the directory; none writes it
  train::Trainer resumed(resumed_config, nullptr);
  resumed.run();
  ASSERT_EQ(resumed.losses().size(), 2u) << "steps 3 and 4";
  for (size_t i = 0; i < 2; ++i)
    EXPECT_NEAR(resumed.losses()[i], straight.losses()[i + 2], 2e-5 * straight.losses()[i + 2]) << "step " << i + 3;
  EXPECT_LT(max_abs_difference(parameters_of(resumed), parameters_of(straight)), 2e-5);
  mpi_world().barrier();
}

TEST(TrainerDdp, CheckpointOfOneProcessResumesOnNRanksUnderDdpAndZero1) {
  // The other way: one process on N*B rows for 4 steps, against one process for 2 steps whose
  // checkpoint N ranks of B rows resume for the last 2, with plain DDP and with ZeRO-1 (which
  // cuts its shard of the unsharded optimizer state out of the checkpoint).
  train::TrainConfig straight_config =
      tiny_config(fresh_dir("grow_straight", /*per_rank=*/true), 2 * world_size(), 1, 4);
  straight_config.schedule.decay_steps = 4;
  train::Trainer straight(straight_config, nullptr);
  straight.run();

  train::TrainConfig first_config = tiny_config(fresh_dir("grow_first"), 2 * world_size(), 1, 2);
  first_config.schedule.decay_steps = 4;  // the schedule of the 4-step run
  if (rank() == 0) train::Trainer(first_config, nullptr).run();
  mpi_world().barrier();  // rank 0's checkpoint is written

  for (int64_t zero : {0, 1}) {
    SCOPED_TRACE("resumed on " + std::to_string(world_size()) + " ranks under zero " + std::to_string(zero));
    train::TrainConfig resumed_config = tiny_config(fresh_dir("grow_resumed_zero" + std::to_string(zero)), 2, 1, 4);
    resumed_config.schedule.decay_steps = 4;
    resumed_config.distributed.zero = zero;
    resumed_config.checkpoint.dir = (fs::path(first_config.out_dir) / "checkpoints").string();  // rank 0's run wrote it
    resumed_config.checkpoint.resume = true;
    resumed_config.checkpoint.save_final = false;  // the checkpoint stays the one of step 2
    train::Trainer resumed(resumed_config, mpi_world_group());
    resumed.run();
    ASSERT_EQ(resumed.losses().size(), 2u) << "steps 3 and 4";
    for (size_t i = 0; i < 2; ++i)
      EXPECT_NEAR(resumed.losses()[i], straight.losses()[i + 2], 2e-5 * straight.losses()[i + 2]) << "step " << i + 3;
    EXPECT_LT(max_abs_difference(parameters_of(resumed), parameters_of(straight)), 2e-5);
    EXPECT_TRUE(same_on_every_rank(parameters_of(resumed))) << "rank " << rank();
  }
  mpi_world().barrier();
}

TEST(TrainerDdp, OnlyRankZeroWritesMetricsCheckpointsAndNumerics) {
  // Each rank its own out_dir, so what each wrote can be told apart; the tokenised text that rank
  // 0 writes into its out_dir is put into the others' by the test (the same files).
  const std::string dir = fresh_dir("writes", /*per_rank=*/true);
  train::TrainConfig config = tiny_config(dir, 2, 1);
  config.precision.report = true;
  config.sample.tokens = 5;
  if (rank() != 0) {
    const fs::path data = fs::path(dir) / "data";
    fs::create_directories(data);
    tokenize_file(config.data.text_file, (data / "words_char").string(), "char", config.data.val_fraction, true);
  }
  train::Trainer trainer(config, mpi_world_group());
  trainer.run();
  const fs::path out = dir;
  for (const char* written : {"metrics.jsonl", "numerics.jsonl", "checkpoints"})
    EXPECT_EQ(fs::exists(out / written), rank() == 0) << written << " on rank " << rank();
  if (rank() == 0) {
    std::ifstream in(out / "metrics.jsonl");
    int64_t lines = std::count(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>(), '\n');
    EXPECT_EQ(lines, 2) << "one record per log interval (steps 2 and 4)";
  }
  // The breakdown has the reductions: comm, and the part the backward did not hide.
  ASSERT_FALSE(trainer.reports().empty());
  std::vector<std::string> phases;
  for (const auto& [name, ms] : trainer.reports().back().phase_ms) phases.push_back(name);
  for (const char* phase : {"comm", "comm_exposed"})
    EXPECT_NE(std::find(phases.begin(), phases.end(), phase), phases.end()) << phase;
}

TEST(TrainerDdp, MismatchedBatchIsAnErrorOnEveryRank) {
  train::TrainConfig config = tiny_config(fresh_dir("mismatch"), 2 + (rank() == world_size() - 1 ? 1 : 0), 1);
  const std::string message = error_of([&] { train::Trainer trainer(config, mpi_world_group()); });
  EXPECT_NE(message.find("rank " + std::to_string(world_size() - 1) + " runs batch.micro_batch 3 but rank 0 runs 2"),
            std::string::npos)
      << "rank " << rank() << ": " << message;
  EXPECT_NE(message.find("every rank must run the same config"), std::string::npos) << message;
}

TEST(TrainerDdp, MismatchedModelIsAnErrorOnEveryRank) {
  train::TrainConfig config = tiny_config(fresh_dir("mismatch_model"), 2, 1);
  if (rank() == world_size() - 1) config.model.n_layer = 3;
  expect_error([&] { train::Trainer trainer(config, mpi_world_group()); }, "built another model than rank 0");
}
