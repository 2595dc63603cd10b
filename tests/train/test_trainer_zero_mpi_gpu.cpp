// The Trainer under ZeRO-1 over NCCL, one rank per GPU, run by `mpirun -np 2` on a
// machine with 2 GPUs (ctest: train_test_trainer_zero_mpi_gpu_np2), against plain DDP
// on the same ranks and batches: the ranks' own gradients are the same bits in both,
// so only the reduction (reduce_scatter against all-reduce) and the grad norm's
// summation order differ. f32; bf16-pure (bf16 parameters, sharded f32 master copies,
// gradients reduce-scattered in bf16); fp16 with dynamic loss scaling (the overflow flag
// comes from the norm summed over the shards, so both runs skip the same steps). Each
// rank holds its shard of the optimizer state, its peak memory lower by the rest, and
// every rank ends with the same parameters, bit for bit. distributed.gather_overlap (the
// parameters gathered behind the next forward) and distributed.fused_gather (gathered by the
// optimizer's own stores) change no bit, eagerly and in a CUDA graph.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "distributed/gpu_ranks.h"
#include "trainer_mpi.h"

using namespace precis;
using precis::testing::nccl_world;
using precis::testing::parameters_of;
namespace fs = std::filesystem;

namespace {

// One run folder for all ranks: rank 0 writes the vocabulary the others read from it.
std::string fresh_dir(const std::string& name) {
  fs::path dir = fs::temp_directory_path() / ("precis_trainer_zero_gpu_" + name);
  if (distributed::mpi_world_rank() == 0) fs::remove_all(dir);
  precis::testing::mpi_barrier();
  return dir.string();
}

train::TrainConfig tiny_config(const std::string& out_dir, const std::string& precision, int64_t zero) {
  train::TrainConfig config =
      train::parse_config(R"(
model: {n_layer: 2, n_head: 2, n_embd: 64, block_size: 64}
data: {text_file: assets/tinyshakespeare.txt, tokenizer: char, order: random}
optimizer: {lr: 1.0e-3, weight_decay: 0.1, grad_clip: 0.5}
schedule: {kind: constant}
sample: {tokens: 0}
max_steps: 6
eval_interval: 6
eval_steps: 2
log_interval: 3
matmul_autotune: false
device: cuda
checkpoint: {save_final: false}
)",
                          {"out_dir=" + out_dir, "precision=" + precision, "batch.micro_batch=4", "batch.seq_len=64"});
  config.distributed.zero = zero;
  return config;
}

// What a run leaves to compare, taken before the next run starts: the device allocator's
// peak is the process's, so each run's is read while it is the only one alive.
struct Outcome {
  std::vector<double> losses;
  std::vector<train::StepReport> reports;
  std::vector<float> parameters;
  int64_t state_bytes = 0, peak_bytes = 0;
};

Outcome train_on_gpus(const std::string& precision, int64_t zero) {
  train::Trainer trainer(tiny_config(fresh_dir(precision + "_zero" + std::to_string(zero)), precision, zero),
                         nccl_world());
  trainer.run();
  precis::testing::mpi_barrier();
  return {trainer.losses(), trainer.reports(), parameters_of(trainer), trainer.optimizer().state_bytes(),
          trainer.peak_memory_bytes()};
}

void expect_zero_trains_as_ddp(const std::string& precision, double loss_tolerance, double parameter_tolerance) {
  const int rank = distributed::mpi_world_rank(), world = distributed::mpi_world_size();
  const Outcome zero = train_on_gpus(precision, 1), ddp = train_on_gpus(precision, 0);

  ASSERT_EQ(zero.losses.size(), ddp.losses.size());
  for (size_t i = 0; i < ddp.losses.size(); ++i)
    EXPECT_NEAR(zero.losses[i], ddp.losses[i], loss_tolerance * ddp.losses[i]) << precision << " step " << i + 1;
  ASSERT_EQ(zero.reports.size(), ddp.reports.size());
  for (size_t i = 0; i < ddp.reports.size(); ++i) {
    EXPECT_NEAR(zero.reports[i].grad_norm, ddp.reports[i].grad_norm, loss_tolerance * ddp.reports[i].grad_norm)
        << precision << " report " << i;
    EXPECT_EQ(zero.reports[i].skipped_steps, ddp.reports[i].skipped_steps) << precision << " report " << i;
  }
  EXPECT_LT(precis::testing::max_abs_difference(zero.parameters, ddp.parameters), parameter_tolerance) << precision;

  // About 1/N of the state on each rank (the shards differ by the padding between parameters).
  EXPECT_NEAR(static_cast<double>(zero.state_bytes), static_cast<double>(ddp.state_bytes) / world,
              0.02 * ddp.state_bytes)
      << precision;
  // The gradients are reduce-scattered in place: the peak drops by the state ZeRO-1 leaves to the other ranks.
  EXPECT_GE(static_cast<double>(ddp.peak_bytes - zero.peak_bytes), 0.9 * (ddp.state_bytes - zero.state_bytes))
      << precision << ": peak " << zero.peak_bytes << " bytes under ZeRO-1, " << ddp.peak_bytes << " under DDP";

  // Every rank holds rank 0's parameters exactly: the all_gather hands out the same chunks.
  EXPECT_TRUE(precis::testing::same_on_every_rank(zero.parameters, *nccl_world())) << "rank " << rank;
  precis::testing::mpi_barrier();
}

}  // namespace

TEST(TrainerNcclZero1, F32TrainsAsDdp) {
  SKIP_WITHOUT_A_GPU_PER_RANK();
  // The same per-rank gradients, reduced in another order: f32 round-off, far below the
  // 6e-3 that six AdamW steps of lr 1e-3 can move a parameter.
  expect_zero_trains_as_ddp("fp32", 1e-5, 1e-5);
}

TEST(TrainerNcclZero1, Bf16PureTrainsAsDdp) {
  SKIP_WITHOUT_A_GPU_PER_RANK();
  // Gradients reduced in bf16 in another order can differ by a bf16 ulp, which the update
  // (on the f32 master) carries into a parameter as at most one bf16 ulp (4e-3 relative) a step.
  expect_zero_trains_as_ddp("bf16-pure", 1e-2, 3e-2);
}

TEST(TrainerNcclZero1, Fp16WithLossScalingSkipsTheSameSteps) {
  SKIP_WITHOUT_A_GPU_PER_RANK();
  expect_zero_trains_as_ddp("fp16", 1e-4, 1e-4);
}

namespace {

// How ZeRO-1 gathers its parameters: the all-gather after the optimizer, behind the next
// forward (distributed.gather_overlap), or by the optimizer's own stores (distributed.fused_gather).
enum class Gather { after, overlap, fused };

// ZeRO-1 gathering as `gather` says: 6 steps, an evaluation reading pending parameters at
// step 3, a checkpoint saving them at step 4 (nothing else completing the gather first), and
// with cuda_graphs the step captured at step 4 after that evaluation completed the gather (the
// captured step must launch it all the same).
Outcome train_with_gather(const std::string& precision, Gather gather, bool graphs) {
  const char* names[] = {"_after", "_overlap", "_fused"};
  const std::string name = precision + names[static_cast<int>(gather)] + (graphs ? "_graphs" : "_eager");
  train::TrainConfig config = tiny_config(fresh_dir(name), precision, 1);
  config.distributed.gather_overlap = gather == Gather::overlap;
  config.distributed.fused_gather = gather == Gather::fused ? train::FusedGather::on : train::FusedGather::off;
  config.cuda_graphs = graphs;
  config.eval_interval = 3;
  config.checkpoint.interval = 4;
  config.distributed.bucket_mb = 0.05;  // several buckets: gathers the forward waits for one by one
  config.distributed.first_bucket_mb = 0.01;
  train::Trainer trainer(config, nccl_world());
  if (gather == Gather::fused && !trainer.gather_fused()) {
    // Refused only where the GPUs cannot store into each other's memory; the caller skips.
    EXPECT_NE(trainer.fused_gather_unavailable().find("NVLink node"), std::string::npos)
        << "refused for another reason: " << trainer.fused_gather_unavailable();
    return {};
  }
  trainer.run();
  precis::testing::mpi_barrier();
  return {trainer.losses(), trainer.reports(), parameters_of(trainer), trainer.optimizer().state_bytes(),
          trainer.peak_memory_bytes()};
}

// Only when or how the gather runs moves: the ranks' gradients, the reductions and the updates
// are the same kernels on the same values, so the runs agree bit for bit.
void expect_gather_changes_no_bit(const std::string& precision, Gather gather, bool graphs) {
  const Outcome off = train_with_gather(precision, Gather::after, graphs);
  const Outcome on = train_with_gather(precision, gather, graphs);
  if (on.losses.empty()) GTEST_SKIP() << "the fused gather needs GPUs that store into each other's memory";
  EXPECT_EQ(on.losses, off.losses) << precision << (graphs ? " with graphs" : "");
  EXPECT_EQ(on.parameters, off.parameters) << precision << (graphs ? " with graphs" : "");
  ASSERT_EQ(on.reports.size(), off.reports.size());
  for (size_t i = 0; i < off.reports.size(); ++i) {
    ASSERT_EQ(on.reports[i].val_loss.has_value(), off.reports[i].val_loss.has_value());
    if (off.reports[i].val_loss) {
      EXPECT_EQ(*on.reports[i].val_loss, *off.reports[i].val_loss) << precision << " report " << i;
    }
  }
  EXPECT_TRUE(precis::testing::same_on_every_rank(on.parameters, *nccl_world()));
  precis::testing::mpi_barrier();
}

}  // namespace

TEST(TrainerNcclZero1, GatherOverlapChangesNoBitEagerly) {
  SKIP_WITHOUT_A_GPU_PER_RANK();
  expect_gather_changes_no_bit("bf16-pure", Gather::overlap, /*graphs=*/false);
  expect_gather_changes_no_bit("fp32", Gather::overlap, /*graphs=*/false);
  expect_gather_changes_no_bit("bf16", Gather::overlap, /*graphs=*/false);  // autocast: gathered before the casts
}

TEST(TrainerNcclZero1, GatherOverlapChangesNoBitInACapturedStep) {
  SKIP_WITHOUT_A_GPU_PER_RANK();
  expect_gather_changes_no_bit("bf16-pure", Gather::overlap, /*graphs=*/true);
  expect_gather_changes_no_bit("fp32", Gather::overlap, /*graphs=*/true);
}

TEST(TrainerNcclZero1, FusedGatherChangesNoBit) {
  SKIP_WITHOUT_A_GPU_PER_RANK();
  expect_gather_changes_no_bit("bf16-pure", Gather::fused, /*graphs=*/false);
  expect_gather_changes_no_bit("bf16-pure", Gather::fused, /*graphs=*/true);
  expect_gather_changes_no_bit("fp32", Gather::fused, /*graphs=*/true);
  expect_gather_changes_no_bit("bf16", Gather::fused, /*graphs=*/false);  // f32 parameters, autocast
}
