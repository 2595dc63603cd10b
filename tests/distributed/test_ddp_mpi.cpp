// The DDP reducer on the MPI backend against one process: N ranks with B rows
// each give the gradients (and, after AdamW steps, the parameters) of one process
// on the N*B rows, in f64 to round-off; no_sync accumulation equals one big batch;
// a parameter without a gradient is an error naming it.
#include <gtest/gtest.h>

#include "ddp_model.h"
#include "distributed/mpi_world.h"
#include "distributed/reducer.h"
#include "optim/adamw.h"
#include "support/errors.h"

using namespace precis;
using namespace precis::testing;  // NOLINT: the test helpers of this folder and support/
using distributed::Reducer;

namespace {

constexpr int64_t kRowsPerRank = 3;
// Small buckets, so the model's 4 parameters make several buckets (first 12 f64s, then 40).
const distributed::ReducerOptions kSmallBuckets{{8 * 12, 8 * 40}, std::nullopt};

// A model of `dtype` with flat parameters, and a second one, identical, as the one-process reference.
struct Replicas {
  explicit Replicas(DType dtype, bool with_unused = false) : ddp(dtype, with_unused), reference(dtype, with_unused) {
    ddp_flat = nn::flatten_parameters(ddp);
    reference_flat = nn::flatten_parameters(reference);
  }
  TinyMlp ddp, reference;
  std::shared_ptr<nn::FlatParameters> ddp_flat, reference_flat;
};

// The MPI group, counting the all-reduces it is asked for and noting where each reduction runs.
class CountingGroup final : public distributed::ProcessGroup {
 public:
  explicit CountingGroup(std::shared_ptr<distributed::ProcessGroup> inner) : inner_(std::move(inner)) {}
  int all_reduces = 0;
  std::vector<distributed::Launch> reductions;  // each all_reduce's and reduce_scatter's Launch
  int rank() const override { return inner_->rank(); }
  int world_size() const override { return inner_->world_size(); }
  Device device() const override { return inner_->device(); }
  std::string backend_name() const override { return inner_->backend_name(); }
  std::shared_ptr<distributed::Work> all_reduce(const Tensor& t, distributed::ReduceOp op, Profiler* p,
                                                distributed::Launch launch) override {
    ++all_reduces;
    reductions.push_back(launch);
    return inner_->all_reduce(t, op, p, launch);
  }
  std::shared_ptr<distributed::Work> broadcast(const Tensor& t, int root) override {
    return inner_->broadcast(t, root);
  }
  std::shared_ptr<distributed::Work> all_gather(const Tensor& out, const Tensor& in,
                                                distributed::Launch launch) override {
    return inner_->all_gather(out, in, launch);
  }
  std::shared_ptr<distributed::Work> reduce_scatter(const Tensor& out, const Tensor& in, distributed::ReduceOp op,
                                                    Profiler* p, distributed::Launch launch) override {
    reductions.push_back(launch);
    return inner_->reduce_scatter(out, in, op, p, launch);
  }
  void barrier() override { inner_->barrier(); }

 private:
  std::shared_ptr<distributed::ProcessGroup> inner_;
};

int world_size() { return mpi_world().world_size(); }
int rank() { return mpi_world().rank(); }

}  // namespace

TEST(Ddp, ReducerMakesSeveralBuckets) {
  Replicas models(DType::f64);
  Reducer reducer(models.ddp_flat, mpi_world_group(), kSmallBuckets);
  // fc2.bias (3) + fc2.weight (24) close the first bucket; fc1.bias (8) + fc1.weight (32) the second.
  ASSERT_EQ(reducer.buckets().size(), 2u);
  EXPECT_EQ(reducer.buckets()[0].slots, (std::vector<size_t>{3, 2}));
  EXPECT_EQ(reducer.buckets()[1].slots, (std::vector<size_t>{1, 0}));
}

TEST(Ddp, GradientsEqualOneProcessOnTheWholeBatch) {
  Replicas models(DType::f64);
  Reducer reducer(models.ddp_flat, mpi_world_group(), kSmallBuckets);
  const Batch all = global_batch(kRowsPerRank * world_size(), DType::f64);
  for (int step = 0; step < 2; ++step) {  // the reducer is ready again after finish()
    models.ddp_flat->zero_grad();
    mse_loss(models.ddp, all.rows(rank() * kRowsPerRank, kRowsPerRank)).backward();
    reducer.finish();
    models.reference_flat->zero_grad();
    mse_loss(models.reference, all).backward();
    EXPECT_LT(relative_difference(grads_of(models.ddp), grads_of(models.reference)), 1e-14) << "step " << step;
  }
}

// Without overlap (a process's first, autotuned step) the buckets wait for finish(): none is
// launched from the backward's hooks, and the gradients come out the same. Launched by the
// hooks they run beside the compute stream; launched by finish(), in order on it.
TEST(Ddp, WithoutOverlapTheBucketsLaunchInFinish) {
  Replicas models(DType::f64);
  auto group = std::make_shared<CountingGroup>(mpi_world_group());
  Reducer reducer(models.ddp_flat, group, kSmallBuckets);
  const Batch all = global_batch(kRowsPerRank * world_size(), DType::f64);
  using distributed::Launch;
  for (bool overlap : {false, true}) {
    reducer.set_overlap(overlap);
    group->all_reduces = 0;
    group->reductions.clear();
    models.ddp_flat->zero_grad();
    mse_loss(models.ddp, all.rows(rank() * kRowsPerRank, kRowsPerRank)).backward();
    EXPECT_EQ(group->all_reduces, overlap ? 2 : 0) << "launched by the backward, overlap " << overlap;
    reducer.finish();
    EXPECT_EQ(group->all_reduces, 2) << "overlap " << overlap;
    const Launch expected = overlap ? Launch::beside : Launch::in_order;
    EXPECT_EQ(group->reductions, (std::vector<Launch>{expected, expected})) << "overlap " << overlap;
    models.reference_flat->zero_grad();
    mse_loss(models.reference, all).backward();
    EXPECT_LT(relative_difference(grads_of(models.ddp), grads_of(models.reference)), 1e-14) << "overlap " << overlap;
  }
}

// One bucket has nothing to overlap: finish() reduces it, in order on the compute stream (a
// captured step's graph then has no second stream), and the gradients are the same.
TEST(Ddp, ALoneBucketIsReducedInOrderInFinish) {
  Replicas models(DType::f64);
  auto group = std::make_shared<CountingGroup>(mpi_world_group());
  Reducer reducer(models.ddp_flat, group, {{1 << 20}, std::nullopt});
  ASSERT_EQ(reducer.buckets().size(), 1u);
  const Batch all = global_batch(kRowsPerRank * world_size(), DType::f64);
  models.ddp_flat->zero_grad();
  mse_loss(models.ddp, all.rows(rank() * kRowsPerRank, kRowsPerRank)).backward();
  EXPECT_EQ(group->all_reduces, 0) << "the backward launched the lone bucket";
  reducer.finish();
  EXPECT_EQ(group->reductions, (std::vector<distributed::Launch>{distributed::Launch::in_order}));
  models.reference_flat->zero_grad();
  mse_loss(models.reference, all).backward();
  EXPECT_LT(relative_difference(grads_of(models.ddp), grads_of(models.reference)), 1e-14);
}

TEST(Ddp, ParametersEqualOneProcessAfterAdamWSteps) {
  Replicas models(DType::f64);
  distributed::broadcast_parameters(*models.ddp_flat, mpi_world());
  Reducer reducer(models.ddp_flat, mpi_world_group(), kSmallBuckets);
  optim::AdamW ddp_opt({{models.ddp.parameters(), 0.1}}, {.lr = 1e-2});
  optim::AdamW reference_opt({{models.reference.parameters(), 0.1}}, {.lr = 1e-2});
  const int steps = 4;
  for (int step = 0; step < steps; ++step) {
    const Batch all = global_batch(kRowsPerRank * world_size() * (step + 1), DType::f64)
                          .rows(kRowsPerRank * world_size() * step, kRowsPerRank * world_size());
    models.ddp_flat->zero_grad();
    mse_loss(models.ddp, all.rows(rank() * kRowsPerRank, kRowsPerRank)).backward();
    reducer.finish();
    ddp_opt.step();
    models.reference_flat->zero_grad();
    mse_loss(models.reference, all).backward();
    reference_opt.step();
  }
  EXPECT_LT(relative_difference(models.ddp.parameters(), models.reference.parameters()), 1e-12);
  // And they moved: the comparison is not between two untouched models.
  TinyMlp initial(DType::f64);
  EXPECT_GT(relative_difference(models.ddp.parameters(), initial.parameters()), 1e-3);
}

TEST(Ddp, NoSyncAccumulationEqualsOneBigBatch) {
  Replicas models(DType::f64);
  Reducer reducer(models.ddp_flat, mpi_world_group(), kSmallBuckets);
  const int micro_steps = 3;
  const Batch all = global_batch(kRowsPerRank * micro_steps * world_size(), DType::f64);
  // Rank r's micro-step m takes rows (r * micro_steps + m) * B ...; each loss is its micro-batch mean / micro_steps.
  auto micro_batch = [&](int m) { return all.rows((rank() * micro_steps + m) * kRowsPerRank, kRowsPerRank); };
  models.ddp_flat->zero_grad();
  {
    distributed::NoSync no_sync(reducer);
    for (int m = 0; m < micro_steps - 1; ++m) mse_loss(models.ddp, micro_batch(m), 1.0 / micro_steps).backward();
    reducer.finish();  // nothing to wait for: the gradients are this rank's own so far
  }
  // So far, this rank's first micro-batches alone.
  models.reference_flat->zero_grad();
  for (int m = 0; m < micro_steps - 1; ++m) mse_loss(models.reference, micro_batch(m), 1.0 / micro_steps).backward();
  EXPECT_LT(relative_difference(grads_of(models.ddp), grads_of(models.reference)), 1e-14);

  EXPECT_TRUE(reducer.sync());
  mse_loss(models.ddp, micro_batch(micro_steps - 1), 1.0 / micro_steps).backward();
  reducer.finish();
  models.reference_flat->zero_grad();
  mse_loss(models.reference, all).backward();
  EXPECT_LT(relative_difference(grads_of(models.ddp), grads_of(models.reference)), 1e-14);
}

TEST(Ddp, ReducingInBf16GivesBf16RoundedMeanGradients) {
  Replicas models(DType::f32);
  Reducer reducer(models.ddp_flat, mpi_world_group(), {{1 << 20, 25 << 20}, DType::bf16});
  const Batch all = global_batch(kRowsPerRank * world_size(), DType::f32);
  models.ddp_flat->zero_grad();
  mse_loss(models.ddp, all.rows(rank() * kRowsPerRank, kRowsPerRank)).backward();
  reducer.finish();
  models.reference_flat->zero_grad();
  mse_loss(models.reference, all).backward();
  // bf16 keeps 8 significant bits: each rank's share and each partial sum are rounded to them.
  EXPECT_LT(relative_difference(grads_of(models.ddp), grads_of(models.reference)), 3e-2);
  for (const Tensor& g : grads_of(models.ddp)) {
    EXPECT_EQ(g.dtype(), DType::f32);
    for (float v : g.to_vector<float>()) EXPECT_EQ(v, static_cast<float>(bfloat16(v))) << "not reduced in bf16";
  }
}

TEST(Ddp, AParameterWithoutGradientIsAnErrorNamingIt) {
  Replicas models(DType::f64, /*with_unused=*/true);
  Reducer reducer(models.ddp_flat, mpi_world_group(), kSmallBuckets);
  const Batch all = global_batch(kRowsPerRank * world_size(), DType::f64);
  models.ddp_flat->zero_grad();
  mse_loss(models.ddp, all.rows(rank() * kRowsPerRank, kRowsPerRank)).backward();
  std::string message = error_of([&] { reducer.finish(); });
  EXPECT_NE(message.find("parameters unused.weight, unused.bias got no gradient"), std::string::npos) << message;
}

TEST(Ddp, ASecondBackwardBeforeFinishIsAnError) {
  Replicas models(DType::f64);
  Reducer reducer(models.ddp_flat, mpi_world_group(), kSmallBuckets);
  const Batch mine = global_batch(kRowsPerRank * world_size(), DType::f64).rows(rank() * kRowsPerRank, kRowsPerRank);
  models.ddp_flat->zero_grad();
  mse_loss(models.ddp, mine).backward();
  expect_error([&] { mse_loss(models.ddp, mine).backward(); }, "got its gradient twice before finish()");
  reducer.finish();
}

TEST(Ddp, BroadcastParametersCopiesRankZerosValues) {
  TinyMlp model(DType::f64);
  auto flat = nn::flatten_parameters(model);
  const std::vector<double> rank0 = flat->buffers()[0].data.to_vector<double>();
  copy_(flat->buffers()[0].data, ops::add(flat->buffers()[0].data, static_cast<double>(rank())));
  distributed::broadcast_parameters(*flat, mpi_world());
  EXPECT_EQ(flat->buffers()[0].data.to_vector<double>(), rank0);
  EXPECT_EQ(model.fc1->weight.to_vector<double>()[5], rank0[5]);  // the parameters are views of it
}

TEST(Ddp, BroadcastParametersCatchesARankWithAnotherModel) {
  TinyMlp model(DType::f64, /*with_unused=*/rank() == world_size() - 1);
  auto flat = nn::flatten_parameters(model);
  expect_error([&] { distributed::broadcast_parameters(*flat, mpi_world()); },
               "rank " + std::to_string(world_size() - 1) + " built another model than rank 0");
}
