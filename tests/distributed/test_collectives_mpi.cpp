// Each collective of the MPI process group against the values computed locally
// from every rank's known inputs (collective_inputs.h: each rank can compute any
// rank's input, and the values are exact in every dtype, so the comparisons are too).
#include <gtest/gtest.h>

#include "core/copy.h"
#include "distributed/collective_inputs.h"
#include "distributed/mpi_world.h"
#include "support/errors.h"

using namespace precis;
using distributed::ReduceOp;
using precis::testing::expect_error;
using precis::testing::input_tensor;
using precis::testing::input_values;
using precis::testing::mpi_world;
using precis::testing::reduced_values;

namespace {

const DType kAllDtypes[] = {DType::f32, DType::f64, DType::f16, DType::bf16, DType::i32, DType::i64};
const DType kFloatDtypes[] = {DType::f32, DType::f64, DType::f16, DType::bf16};

}  // namespace

TEST(MpiCollectives, GroupIsTheWholeMpiWorld) {
  EXPECT_EQ(mpi_world().backend_name(), "mpi");
  EXPECT_EQ(mpi_world().device(), Device::cpu());
  EXPECT_GE(mpi_world().world_size(), 2);
  // Every rank holds a distinct rank: their sum is 0 + 1 + ... + (N-1).
  Tensor rank = full({1}, mpi_world().rank(), DType::i64);
  mpi_world().all_reduce(rank, ReduceOp::sum)->wait();
  const int n = mpi_world().world_size();
  EXPECT_EQ(rank.item<int64_t>(), n * (n - 1) / 2);
}

TEST(MpiCollectives, AllReduceSumEqualsTheSumOfEveryRanksInput) {
  const int64_t n = 1001;
  for (DType dtype : kAllDtypes) {
    Tensor t = input_tensor(dtype, mpi_world().rank(), n);
    mpi_world().all_reduce(t, ReduceOp::sum)->wait();
    EXPECT_EQ(t.dtype(), dtype);
    EXPECT_EQ(t.to_vector<double>(), reduced_values(n, ReduceOp::sum, mpi_world().world_size())) << dtype;
  }
}

TEST(MpiCollectives, AllReduceAvgEqualsTheMeanOfEveryRanksInput) {
  const int64_t n = 257;
  for (DType dtype : kFloatDtypes) {
    Tensor t = input_tensor(dtype, mpi_world().rank(), n);
    mpi_world().all_reduce(t, ReduceOp::avg)->wait();
    EXPECT_EQ(t.to_vector<double>(), reduced_values(n, ReduceOp::avg, mpi_world().world_size())) << dtype;
  }
}

TEST(MpiCollectives, SixteenBitSumsAreRoundedToTheirFormat) {
  if (mpi_world().world_size() != 2) GTEST_SKIP() << "needs exactly two ranks: one addition, one rounding";
  // 1 + 3 * 2^-9 lies between bf16's 1 and 1 + 2^-7 (nearer the latter); f16 holds it exactly.
  const double mine = mpi_world().rank() == 0 ? 1.0 : 3.0 / 512;
  for (DType dtype : {DType::bf16, DType::f16}) {
    Tensor t = full({3}, mine, dtype);
    mpi_world().all_reduce(t, ReduceOp::sum)->wait();
    const double expected = dtype == DType::bf16 ? 1.0 + 1.0 / 128 : 1.0 + 3.0 / 512;
    EXPECT_EQ(t.to_vector<double>(), std::vector<double>(3, expected)) << dtype;
  }
}

TEST(MpiCollectives, CollectivesInFlightTogetherEachGetTheirResult) {
  const int64_t n = 64;
  Tensor a = input_tensor(DType::f32, mpi_world().rank(), n);
  Tensor b = input_tensor(DType::f64, mpi_world().rank(), n + 3);
  auto work_a = mpi_world().all_reduce(a, ReduceOp::sum);
  auto work_b = mpi_world().all_reduce(b, ReduceOp::avg);
  work_b->wait();
  work_a->wait();
  work_a->wait();  // idempotent
  EXPECT_EQ(a.to_vector<double>(), reduced_values(n, ReduceOp::sum, mpi_world().world_size()));
  EXPECT_EQ(b.to_vector<double>(), reduced_values(n + 3, ReduceOp::avg, mpi_world().world_size()));
}

TEST(MpiCollectives, BroadcastCopiesTheRootsTensorFromAnyRoot) {
  const int64_t n = 100;
  for (int root = 0; root < mpi_world().world_size(); ++root) {
    for (DType dtype : kAllDtypes) {
      Tensor t = input_tensor(dtype, mpi_world().rank(), n);
      mpi_world().broadcast(t, root)->wait();
      EXPECT_EQ(t.to_vector<double>(), input_values(root, n)) << dtype << " from root " << root;
    }
  }
}

TEST(MpiCollectives, AllGatherPutsEachRanksInputAtItsRank) {
  const int64_t n = 37;
  const int world = mpi_world().world_size();
  for (DType dtype : kAllDtypes) {
    Tensor input = input_tensor(dtype, mpi_world().rank(), n);
    Tensor output = full({world * n}, -99.0, dtype);
    mpi_world().all_gather(output, input)->wait();
    std::vector<double> expected;
    for (int r = 0; r < world; ++r)
      for (double v : input_values(r, n)) expected.push_back(v);
    EXPECT_EQ(output.to_vector<double>(), expected) << dtype;
  }
}

TEST(MpiCollectives, ReduceScatterGivesEachRankItsChunkOfTheReduction) {
  const int64_t chunk = 29;
  const int world = mpi_world().world_size();
  const int rank = mpi_world().rank();
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg}) {
    for (DType dtype : kFloatDtypes) {
      Tensor input = input_tensor(dtype, rank, chunk * world);
      Tensor output = zeros({chunk}, dtype);
      mpi_world().reduce_scatter(output, input, op)->wait();
      std::vector<double> all = reduced_values(chunk * world, op, world);
      EXPECT_EQ(output.to_vector<double>(),
                std::vector<double>(all.begin() + rank * chunk, all.begin() + (rank + 1) * chunk))
          << dtype << " " << distributed::reduce_op_name(op);
      EXPECT_EQ(input.to_vector<double>(), input_values(rank, chunk * world)) << "the input is left as it was";
    }
  }
}

TEST(MpiCollectives, InPlaceAllGatherAndReduceScatterUseThisRanksChunk) {
  // ZeRO-1's calls: the input of all_gather, and the output of reduce_scatter, is this rank's
  // chunk of the other tensor.
  const int64_t chunk = 29;
  const int world = mpi_world().world_size();
  const int rank = mpi_world().rank();
  for (DType dtype : kFloatDtypes) {
    Tensor gathered = full({world * chunk}, -99.0, dtype);
    Tensor mine = gathered.slice(0, rank * chunk, (rank + 1) * chunk);
    copy_(mine, input_tensor(dtype, rank, chunk));
    mpi_world().all_gather(gathered, mine)->wait();
    std::vector<double> expected;
    for (int r = 0; r < world; ++r)
      for (double v : input_values(r, chunk)) expected.push_back(v);
    EXPECT_EQ(gathered.to_vector<double>(), expected) << dtype;

    for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg}) {
      Tensor input = input_tensor(dtype, rank, chunk * world);
      mpi_world().reduce_scatter(input.slice(0, rank * chunk, (rank + 1) * chunk), input, op)->wait();
      std::vector<double> all = reduced_values(chunk * world, op, world), got = input.to_vector<double>();
      EXPECT_EQ(std::vector<double>(got.begin() + rank * chunk, got.begin() + (rank + 1) * chunk),
                std::vector<double>(all.begin() + rank * chunk, all.begin() + (rank + 1) * chunk))
          << dtype << " " << distributed::reduce_op_name(op);
    }
  }
}

TEST(MpiCollectives, BarrierReturnsOnEveryRank) {
  mpi_world().barrier();
  mpi_world().barrier();
}

// Argument errors are raised before anything is sent, on every rank alike.
TEST(MpiCollectives, BadArgumentsAreErrorsNamingTheCollective) {
  distributed::ProcessGroup& group = mpi_world();
  Tensor strided = zeros({4, 6}, DType::f32).transpose(0, 1);
  expect_error([&] { group.all_reduce(strided, ReduceOp::sum); }, "all_reduce: needs a contiguous tensor");
  expect_error([&] { group.all_reduce(zeros({3}, DType::i32), ReduceOp::avg); },
               "all_reduce: avg needs a floating tensor");
  expect_error([&] { group.all_reduce(zeros({3}, DType::u8), ReduceOp::sum); }, "all_reduce: unsupported dtype");
  expect_error([&] { group.broadcast(zeros({3}), group.world_size()); }, "broadcast: root");
  expect_error([&] { group.all_gather(zeros({5}), zeros({3})); }, "all_gather: the float32[5]");
  expect_error([&] { group.reduce_scatter(zeros({3}), zeros({3 * group.world_size()}, DType::f64), ReduceOp::sum); },
               "reduce_scatter: the two tensors differ in dtype");
}
