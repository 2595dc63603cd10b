// ZeRO-1 on the MPI backend against plain DDP: the tiny model's 67 parameters (a
// count no world size here divides, so the flat buffer is padded) trained by AdamW
// with the gradients clipped end up the same as under DDP (f64 to round-off, f32
// close); each rank holds only its shard of the optimizer state, their sum the whole;
// the state gathered from the shards is the DDP optimizer's, and cut back into shards
// it continues the run as DDP does (AdamW; SGD with momentum too); an inf on one rank's shard skips every rank's step.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "ddp_model.h"
#include "distributed/mpi_world.h"
#include "distributed/reducer.h"
#include "distributed/zero.h"
#include "optim/adamw.h"
#include "optim/clip_grad.h"
#include "optim/sgd.h"

using namespace precis;
using namespace precis::testing;  // NOLINT: the test helpers of this folder and support/

namespace {

constexpr int64_t kRowsPerRank = 3;
constexpr double kMaxNorm = 0.05;  // below the tiny model's gradient norm: every step clips
// Buckets of 96 bytes, rounded up to world_size 64-byte lines: several, and in f32 a
// parameter cut between two (fc2.weight, elements 48..71, by the boundary at 64).
const distributed::ReducerOptions kSmallShardBuckets{.bucket_sizes = {96, 96}, .shard = true};

int world_size() { return mpi_world().world_size(); }
int rank() { return mpi_world().rank(); }

// Rows of step `step`'s global batch that this rank takes.
Batch my_rows(int step, DType dtype) {
  const int64_t global = kRowsPerRank * world_size();
  return global_batch(global * (step + 1), dtype).rows(global * step + rank() * kRowsPerRank, kRowsPerRank);
}

std::vector<Tensor> params_of(const optim::Optimizer& optimizer) {
  std::vector<Tensor> params;
  for (const optim::ParamGroup& group : const_cast<optim::Optimizer&>(optimizer).param_groups())
    params.insert(params.end(), group.params.begin(), group.params.end());
  return params;
}

// The optimizer of a run over `groups`: AdamW, or SGD with Nesterov momentum.
std::unique_ptr<optim::Optimizer> make_optimizer(std::vector<optim::ParamGroup> groups, bool sgd) {
  if (sgd) return std::make_unique<optim::SGD>(groups, optim::SGDOptions{.lr = 0.1, .momentum = 0.9, .nesterov = true});
  return std::make_unique<optim::AdamW>(groups, optim::AdamWOptions{.lr = 1e-2});
}

// One model trained under plain DDP.
struct DdpRun {
  explicit DdpRun(DType dtype, bool sgd = false) : model(dtype) {
    flat = nn::flatten_parameters(model);
    distributed::broadcast_parameters(*flat, mpi_world());
    reducer = std::make_unique<distributed::Reducer>(flat, mpi_world_group());
    optimizer = make_optimizer(optim::default_param_groups(model, 0.1), sgd);
  }
  // One step; returns {norm, factor}.
  std::vector<double> step(int step) {
    flat->zero_grad();
    mse_loss(model, my_rows(step, model.fc1->weight.dtype())).backward();
    reducer->finish();
    Tensor norm = optim::clip_grad_norm(model.parameters(), kMaxNorm);
    optimizer->step({.grad_factor = norm.select(0, 1)});
    return norm.to_vector<double>();
  }
  TinyMlp model;
  std::shared_ptr<nn::FlatParameters> flat;
  std::unique_ptr<distributed::Reducer> reducer;
  std::unique_ptr<optim::Optimizer> optimizer;
};

// The same model trained under ZeRO-1.
struct ZeroRun {
  explicit ZeroRun(DType dtype, bool sgd = false, const distributed::ReducerOptions& options = kSmallShardBuckets)
      : model(dtype) {
    flat = nn::flatten_parameters(model, Device::cpu(), std::nullopt, world_size());
    distributed::broadcast_parameters(*flat, mpi_world());
    reducer = std::make_unique<distributed::Reducer>(flat, mpi_world_group(), options);
    zero = std::make_unique<distributed::Zero1>(flat, mpi_world_group(), *reducer);
    optimizer = make_optimizer(zero->shard_groups(optim::default_param_groups(model, 0.1)), sgd);
  }
  std::vector<double> step(int step, const Tensor& found_inf = Tensor()) {
    flat->zero_grad();
    mse_loss(model, my_rows(step, model.fc1->weight.dtype())).backward();
    reducer->finish();
    Tensor norm = optim::clip_grad_norm(params_of(*optimizer), kMaxNorm, Tensor(), found_inf, Tensor(),
                                        [this](const Tensor& sum) { zero->sum_over_ranks(sum); });
    optimizer->step({.grad_factor = norm.select(0, 1), .skip_if = found_inf});
    zero->gather_parameters();
    return norm.to_vector<double>();
  }
  TinyMlp model;
  std::shared_ptr<nn::FlatParameters> flat;
  std::unique_ptr<distributed::Reducer> reducer;
  std::unique_ptr<distributed::Zero1> zero;
  std::unique_ptr<optim::Optimizer> optimizer;
};

void expect_zero_equals_ddp(DType dtype, double tolerance, bool sgd = false) {
  DdpRun ddp(dtype, sgd);
  ZeroRun zero(dtype, sgd);
  const std::vector<Tensor> start = [&] {
    std::vector<Tensor> copies;
    for (const Tensor& p : ddp.model.parameters()) copies.push_back(p.clone());
    return copies;
  }();
  for (int step = 0; step < 4; ++step) {
    const std::vector<double> ddp_norm = ddp.step(step), zero_norm = zero.step(step);
    EXPECT_GT(ddp_norm[0], kMaxNorm) << "step " << step << ": the test means to clip";
    EXPECT_NEAR(zero_norm[0], ddp_norm[0], tolerance * ddp_norm[0]) << "step " << step;
    EXPECT_NEAR(zero_norm[1], ddp_norm[1], tolerance * ddp_norm[1]) << "step " << step;
  }
  EXPECT_LT(relative_difference(zero.model.parameters(), ddp.model.parameters()), tolerance);
  EXPECT_GT(relative_difference(ddp.model.parameters(), start), 1e-3);  // they moved
}

}  // namespace

TEST(Zero1, PadsTheFlatBufferIntoEqualAlignedShards) {
  TinyMlp model(DType::f64);
  auto flat = nn::flatten_parameters(model, Device::cpu(), std::nullopt, world_size());
  ASSERT_EQ(flat->buffers().size(), 1u);
  const nn::FlatBuffer& buffer = flat->buffers()[0];
  const int64_t used = buffer.slots.back().offset + buffer.slots.back().numel;  // 67: no world size here divides it
  EXPECT_EQ(used, 67);
  EXPECT_EQ(buffer.data.numel() % (world_size() * 8), 0);  // shards of whole 64-byte lines of f64
  EXPECT_GE(buffer.data.numel(), used);
  EXPECT_LT(buffer.data.numel(), used + world_size() * 8);
  EXPECT_EQ(buffer.grad.numel(), buffer.data.numel());
}

TEST(Zero1, BucketsTileTheBufferInAlignedChunksAndCutParameters) {
  ZeroRun zero(DType::f32);
  const std::vector<distributed::Bucket>& buckets = zero.reducer->buckets();
  ASSERT_GE(buckets.size(), 2u);
  int64_t end = zero.flat->buffers()[0].data.numel();
  bool cut = false;
  for (const distributed::Bucket& bucket : buckets) {
    EXPECT_EQ(bucket.end, end);                                       // from the end backwards, no gaps
    EXPECT_EQ((bucket.end - bucket.begin) % (world_size() * 16), 0);  // 16 f32 to a line
    end = bucket.begin;
    for (size_t s : bucket.slots) {
      const nn::FlatSlot& slot = zero.flat->buffers()[0].slots[s];
      cut |= slot.offset < bucket.begin || slot.offset + slot.numel > bucket.end;
    }
  }
  EXPECT_EQ(end, 0);
  EXPECT_TRUE(cut) << "some parameter lies in two buckets";
}

TEST(Zero1, EqualsDdpAfterClippedAdamWStepsInF64) { expect_zero_equals_ddp(DType::f64, 1e-12); }

TEST(Zero1, EqualsDdpAfterClippedAdamWStepsInF32) { expect_zero_equals_ddp(DType::f32, 2e-6); }

TEST(Zero1, EqualsDdpAfterClippedSgdStepsWithMomentum) { expect_zero_equals_ddp(DType::f64, 1e-12, /*sgd=*/true); }

TEST(Zero1, EachRankHoldsItsShardOfTheOptimizerState) {
  DdpRun ddp(DType::f64);
  ZeroRun zero(DType::f64);
  for (int step = 0; step < 2; ++step) {
    ddp.step(step);
    zero.step(step);
  }
  const int64_t whole = ddp.optimizer->state_bytes();
  const int64_t mine = zero.optimizer->state_bytes();
  EXPECT_EQ(whole, 67 * 16);  // two f64 moments per parameter element
  // The shards add up to the whole, each at most one shard's elements' worth.
  EXPECT_EQ(sum_over_ranks(mine), whole);
  EXPECT_LE(mine, 16 * zero.zero->owned_elements(0));
  EXPECT_EQ(mine, zero.optimizer->state_bytes_per_element(DType::f64) * zero.zero->shard_elements(0));
  EXPECT_EQ(zero.zero->total_elements(0), 67);
  EXPECT_EQ(sum_over_ranks(zero.zero->shard_elements(0)), 67);
  // The padding is no parameter's: it stays zero.
  const nn::FlatBuffer& buffer = zero.flat->buffers()[0];
  const std::vector<double> values = buffer.data.to_vector<double>();
  for (int64_t i = 67; i < buffer.data.numel(); ++i) EXPECT_EQ(values[i], 0.0) << "element " << i;
}

namespace {

// After some steps the state gathered from the shards is DDP's; a fresh ZeRO-1 run that
// loads DDP's state (and weights), cut into shards, steps on as DDP does.
void expect_gathered_state_is_ddps(DType dtype, double tolerance) {
  DdpRun ddp(dtype);
  ZeroRun zero(dtype);
  for (int step = 0; step < 3; ++step) {
    ddp.step(step);
    zero.step(step);
  }
  const std::map<std::string, Tensor> ddp_state = ddp.optimizer->state_dict();
  const std::map<std::string, Tensor> gathered = zero.zero->gather_state(zero.optimizer->state_dict());
  ASSERT_EQ(gathered.size(), ddp_state.size());
  for (const auto& [key, value] : ddp_state) {
    ASSERT_TRUE(gathered.count(key)) << key;
    EXPECT_EQ(gathered.at(key).shape(), value.shape()) << key;
    EXPECT_EQ(gathered.at(key).dtype(), value.dtype()) << key;
    EXPECT_LT(relative_difference({gathered.at(key)}, {value}), tolerance) << key;
  }

  ZeroRun resumed(dtype);
  {
    NoGradGuard no_grad;
    for (size_t i = 0; i < ddp.model.parameters().size(); ++i)
      copy_(resumed.model.parameters()[i], ddp.model.parameters()[i]);
  }
  resumed.optimizer->load_state_dict(resumed.zero->shard_state(ddp_state));
  for (int step = 3; step < 5; ++step) {
    ddp.step(step);
    resumed.step(step);
  }
  EXPECT_LT(relative_difference(resumed.model.parameters(), ddp.model.parameters()), tolerance);
}

}  // namespace

TEST(Zero1, GatheredStateIsDdpsAndItsShardsResumeTheRun) { expect_gathered_state_is_ddps(DType::f64, 1e-12); }

TEST(Zero1, GatheredStateWithBf16MasterCopiesIsDdps) {
  // bf16 parameters: AdamW keeps f32 master copies, sharded and gathered like the moments. The
  // ranks' gradients, reduced in f32 in another order, may round a parameter to a neighbouring
  // bf16 value (4e-3 relative); a misplaced or missing piece would be off by the values themselves.
  expect_gathered_state_is_ddps(DType::bf16, 2e-2);
  DdpRun ddp(DType::bf16);
  ddp.step(0);
  EXPECT_TRUE(ddp.optimizer->state_dict().count("state.0.master")) << "the test means to gather master copies";
}

TEST(Zero1, AnInfInOneRanksShardSkipsEveryRanksStep) {
  // One bucket, reduced once fc1.weight's gradient is final: the test's hook on fc2.bias runs before that.
  ZeroRun zero(DType::f64, /*sgd=*/false, distributed::ReducerOptions{.shard = true});
  zero.step(0);
  std::vector<Tensor> before;
  for (const Tensor& p : zero.model.parameters()) before.push_back(p.clone());
  // Rank 0's gradient of fc2.bias, the last parameter (in the last rank's chunk), turns inf once
  // it is final, before the reducer's reduce_scatter.
  bool poison = true;
  zero.model.fc2->bias.register_grad_ready_hook([&](const Tensor& grad) {
    if (!poison || rank() != 0) return;
    NoGradGuard no_grad;
    fill_(grad.slice(0, 2, 3), std::numeric_limits<double>::infinity());
  });
  Tensor found_inf = zeros({}, DType::f64);
  const std::vector<double> norm = zero.step(1, found_inf);
  poison = false;
  EXPECT_TRUE(std::isinf(norm[0])) << "rank " << rank();
  EXPECT_EQ(found_inf.item<double>(), 1.0) << "rank " << rank();
  EXPECT_EQ(relative_difference(zero.model.parameters(), before), 0.0) << "rank " << rank();
}
