// The NCCL process group and the DDP reducer on GPUs, one rank per GPU, run under
// `mpirun -np 2` (ctest: distributed_test_nccl_mpi_gpu_np2). Collectives against
// the values computed from every rank's known inputs; the unique id shared through
// MPI and through the TCP rendezvous; DDP gradients against one process on the
// whole batch, in f32 and with bf16 parameters reduced in bf16; the watchdog: a hung
// rank makes the others fail within the timeout, in synchronize() and in a read-back.
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <thread>

#include "core/cuda_graph.h"
#include "ddp_model.h"
#include "distributed/collective_inputs.h"
#include "distributed/cuda/nccl_process_group.h"
#include "distributed/gpu_ranks.h"
#include "distributed/launch.h"
#include "distributed/mpi_runtime.h"
#include "distributed/reducer.h"
#include "distributed/tcp_rendezvous.h"
#include "optim/adamw.h"
#include "support/free_port.h"

using namespace precis;
using distributed::ProcessGroup;
using distributed::ReduceOp;
using precis::testing::Batch;
using precis::testing::free_port;
using precis::testing::global_batch;
using precis::testing::grads_of;
using precis::testing::input_tensor;
using precis::testing::input_values;
using precis::testing::mse_loss;
using precis::testing::my_gpu;
using precis::testing::nccl_world;
using precis::testing::reduced_values;
using precis::testing::relative_difference;
using precis::testing::TinyMlp;

TEST(NcclCollectives, AllReduceMatchesTheReductionOfEveryRanksInput) {
  SKIP_WITHOUT_A_GPU_PER_RANK();
  ProcessGroup& group = *nccl_world();
  EXPECT_EQ(group.backend_name(), "nccl");
  EXPECT_EQ(group.device(), my_gpu());
  const int64_t n = 100003;  // several NCCL chunks
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg}) {
    for (DType dtype : {DType::f32, DType::f64, DType::f16, DType::bf16}) {
      Tensor t = input_tensor(dtype, group.rank(), n, my_gpu());
      group.all_reduce(t, op)->wait();
      // Queued on the compute stream after wait(): it sees the reduced values.
      Tensor doubled = t * 2.0;
      std::vector<double> expected = reduced_values(n, op, group.world_size());
      for (double& v : expected) v *= 2;
      EXPECT_EQ(doubled.to_vector<double>(), expected) << dtype << " " << distributed::reduce_op_name(op);
    }
  }
  Tensor ints = input_tensor(DType::i64, group.rank(), 10, my_gpu());
  group.all_reduce(ints, ReduceOp::sum)->wait();
  EXPECT_EQ(ints.to_vector<double>(), reduced_values(10, ReduceOp::sum, group.world_size()));
}

TEST(NcclCollectives, BroadcastAllGatherAndReduceScatter) {
  SKIP_WITHOUT_A_GPU_PER_RANK();
  ProcessGroup& group = *nccl_world();
  const int world = group.world_size(), rank = group.rank();
  const int64_t n = 4099;
  for (int root = 0; root < world; ++root) {
    Tensor t = input_tensor(DType::bf16, rank, n, my_gpu());
    group.broadcast(t, root)->wait();
    EXPECT_EQ(t.to_vector<double>(), input_values(root, n));
  }
  Tensor gathered = zeros({n * world}, DType::f32, my_gpu());
  group.all_gather(gathered, input_tensor(DType::f32, rank, n, my_gpu()))->wait();
  std::vector<double> expected;
  for (int r = 0; r < world; ++r)
    for (double v : input_values(r, n)) expected.push_back(v);
  EXPECT_EQ(gathered.to_vector<double>(), expected);

  Tensor input = input_tensor(DType::f32, rank, n * world, my_gpu());
  Tensor chunk = zeros({n}, DType::f32, my_gpu());
  group.reduce_scatter(chunk, input, ReduceOp::avg)->wait();
  std::vector<double> all = reduced_values(n * world, ReduceOp::avg, world);
  EXPECT_EQ(chunk.to_vector<double>(), std::vector<double>(all.begin() + rank * n, all.begin() + (rank + 1) * n));
  group.barrier();
}

// Launch::in_order runs the collective on the compute stream: values as beside it, and a step
// captured with it stays one chain of nodes (no fork to the communication stream), which a
// replay runs faster (process_group.h, "Launch").
TEST(NcclCollectives, InOrderCollectivesGiveTheSameValuesAndKeepACapturedGraphOneStream) {
  SKIP_WITHOUT_A_GPU_PER_RANK();
  ProcessGroup& group = *nccl_world();
  const int world = group.world_size(), rank = group.rank();
  const int64_t n = 4099;
  const Tensor source = input_tensor(DType::f32, rank, n * world, my_gpu());
  std::vector<double> sums = reduced_values(n * world, ReduceOp::sum, world);
  for (double& v : sums) v *= 2;
  const std::vector<double> chunk_sums(sums.begin() + rank * n, sums.begin() + (rank + 1) * n);
  group.all_reduce(zeros({1}, DType::f32, my_gpu()), ReduceOp::sum)->wait();  // the communicator, before a capture
  for (distributed::Launch launch : {distributed::Launch::in_order, distributed::Launch::beside}) {
    const bool in_order = launch == distributed::Launch::in_order;
    Tensor all = zeros({n * world}, DType::f32, my_gpu()), chunk = zeros({n}, DType::f32, my_gpu());
    Tensor doubled = zeros({n}, DType::f32, my_gpu()), beside_it = zeros({n}, DType::f32, my_gpu());
    // A step's shape: compute, a reduction with other compute queued before its wait (the
    // reducer's phase events), compute on its result, a gather, compute.
    auto step = [&] {
      copy_(all, source);
      std::shared_ptr<distributed::Work> reduced = group.reduce_scatter(chunk, all, ReduceOp::sum, nullptr, launch);
      fill_(beside_it, 1.0);
      reduced->wait();
      copy_(chunk, chunk * 2.0);
      group.all_gather(all, chunk, launch)->wait();
      copy_(doubled, all.slice(0, rank * n, (rank + 1) * n));
    };
    step();
    EXPECT_EQ(doubled.to_vector<double>(), chunk_sums) << "eager, in order " << in_order;
    EXPECT_EQ(all.to_vector<double>(), sums) << "eager, in order " << in_order;
    CudaGraph graph(my_gpu());
    graph.capture(step);
    EXPECT_EQ(graph.num_forks() == 0, in_order) << graph.num_forks() << " forks, in order " << in_order;
    fill_(doubled, 0.0);
    graph.replay();
    EXPECT_EQ(doubled.to_vector<double>(), chunk_sums) << "replayed, in order " << in_order;
  }
}

TEST(NcclCollectives, UniqueIdSharedThroughTheTcpRendezvous) {
  SKIP_WITHOUT_A_GPU_PER_RANK();
  // Rank 0 picks a free port (MASTER_PORT's role) and tells the others through MPI.
  int port = free_port();
  distributed::mpi_broadcast_bytes(&port, sizeof port, 0);
  const int rank = distributed::mpi_world_rank(), world = distributed::mpi_world_size();
  auto group = distributed::make_nccl_process_group(rank, world, my_gpu(), [&](std::vector<uint8_t>& bytes) {
    bytes = distributed::tcp_broadcast_bytes({"127.0.0.1", port}, rank, world, bytes, std::chrono::seconds(60));
  });
  Tensor t = input_tensor(DType::f32, rank, 1000, my_gpu());
  group->all_reduce(t, ReduceOp::sum)->wait();
  EXPECT_EQ(t.to_vector<double>(), reduced_values(1000, ReduceOp::sum, world));
}

TEST(NcclDdp, F32GradientsEqualOneGpuOnTheWholeBatch) {
  SKIP_WITHOUT_A_GPU_PER_RANK();
  ProcessGroup& group = *nccl_world();
  const int64_t rows = 4;
  TinyMlp ddp(DType::f32), single(DType::f32);
  auto ddp_flat = nn::flatten_parameters(ddp, my_gpu());
  auto single_flat = nn::flatten_parameters(single, my_gpu());
  distributed::Reducer reducer(ddp_flat, nccl_world(), {{8 * 12, 8 * 40}, std::nullopt});
  const Batch all = global_batch(rows * group.world_size(), DType::f32).to(my_gpu());
  ddp_flat->zero_grad();
  mse_loss(ddp, all.rows(group.rank() * rows, rows)).backward();
  reducer.finish();
  single_flat->zero_grad();
  mse_loss(single, all).backward();
  EXPECT_LT(relative_difference(grads_of(ddp), grads_of(single)), 1e-5);
}

TEST(NcclDdp, Bf16ParametersReducedInBf16MatchTheF64ReferenceAndStayIdenticalAcrossRanks) {
  SKIP_WITHOUT_A_GPU_PER_RANK();
  ProcessGroup& group = *nccl_world();
  const int64_t rows = 4;
  TinyMlp ddp(DType::f32), reference(DType::f64);
  auto ddp_flat = nn::flatten_parameters(ddp, my_gpu(), DType::bf16);
  auto reference_flat = nn::flatten_parameters(reference);
  distributed::broadcast_parameters(*ddp_flat, group);
  distributed::Reducer reducer(ddp_flat, nccl_world(), {{1 << 20, 25 << 20}, DType::bf16});
  optim::AdamW opt({{ddp.parameters(), 0.1}}, {.lr = 1e-2});
  for (int step = 0; step < 3; ++step) {
    const Batch all = global_batch(rows * group.world_size() * (step + 1), DType::f64)
                          .rows(rows * group.world_size() * step, rows * group.world_size());
    ddp_flat->zero_grad();
    Batch mine = all.rows(group.rank() * rows, rows);
    // bf16 inputs; the targets in f32, so the loss is an f32 mean.
    mse_loss(ddp, Batch{mine.x.to(DType::bf16), mine.y.to(DType::f32)}.to(my_gpu())).backward();
    reducer.finish();
    if (step == 0) {
      reference_flat->zero_grad();
      mse_loss(reference, all).backward();
      // bf16 inputs, parameters and reduction: a few bf16 roundings (8 significant bits) apart.
      EXPECT_LT(relative_difference(grads_of(ddp), grads_of(reference)), 5e-2);
      int64_t not_bf16 = 0;
      for (const Tensor& g : grads_of(ddp))
        for (float v : g.to_vector<float>()) not_bf16 += v != static_cast<float>(bfloat16(v));
      EXPECT_EQ(not_bf16, 0) << "gradients not reduced in bf16";
    }
    opt.step();
  }
  // Every rank applied the same averaged gradients: the parameters are bitwise equal.
  const Tensor& mine = ddp_flat->buffers()[0].data;
  Tensor all_ranks = zeros({mine.numel() * group.world_size()}, mine.dtype(), my_gpu());
  group.all_gather(all_ranks, mine)->wait();
  std::vector<double> values = all_ranks.to_vector<double>();
  for (int r = 1; r < group.world_size(); ++r)
    EXPECT_TRUE(std::equal(values.begin(), values.begin() + mine.numel(), values.begin() + r * mine.numel()))
        << "rank " << r << " holds other parameters than rank 0";
}

namespace {

// The last rank joins an all-reduce 3 s late; every rank then waits for it as `wait_for` does,
// under a 1 s timeout and a 0.5 s grace. The others give up at 1 s, abort their communicators,
// ask the others over MPI for 0.5 s and name the late rank, which never answers. The late
// rank's own all-reduce then meets peers that have aborted: NCCL may fail it or let it finish
// (on an H200 host it finished), so for that rank only "it does not hang" is asserted.
void expect_the_late_rank_named(const std::function<void(ProcessGroup&, const Tensor&)>& wait_for) {
  const int rank = distributed::mpi_world_rank(), world = distributed::mpi_world_size();
  auto group = distributed::make_nccl_process_group(
      rank, world, my_gpu(),
      [](std::vector<uint8_t>& bytes) { distributed::mpi_broadcast_bytes(bytes.data(), bytes.size(), 0); },
      std::chrono::milliseconds(1000), /*answer_grace=*/std::chrono::milliseconds(500));
  Tensor warm = zeros({16}, DType::f32, my_gpu());
  group->all_reduce(warm, ReduceOp::sum)->wait();  // the communicator is made by every rank
  group->synchronize();
  const int late = world - 1;
  Tensor t = full({16}, 1.0, DType::f32, my_gpu());
  if (rank == late) std::this_thread::sleep_for(std::chrono::milliseconds(3000));
  const auto start = std::chrono::steady_clock::now();
  std::string message;
  try {
    wait_for(*group, t);
  } catch (const Error& e) {
    message = e.what();
  }
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(waited, 2.5) << "rank " << rank;
  if (rank != late) {
    EXPECT_NE(message.find("nccl: rank " + std::to_string(rank) + " of " + std::to_string(world) +
                           ": all_reduce #2 did not complete within 1 s"),
              std::string::npos)
        << message;
    EXPECT_NE(message.find("Rank " + std::to_string(late) + " did not answer within 0.5 s"), std::string::npos)
        << message;
    EXPECT_GE(waited, 1.5);
  }
  int token = 0;
  distributed::mpi_broadcast_bytes(&token, sizeof token, 0);  // every rank is done before the next test
  // Every rank answered that broadcast, so none is gone: exit through MPI_Finalize, not the
  // abort that a timed-out collective otherwise leads to (the process would fail the test run).
  if (rank != late) {
    EXPECT_TRUE(distributed::collective_given_up());
  }
  distributed::clear_collective_given_up();
}

}  // namespace

TEST(NcclWatchdog, RankWaitingForAHungPeerFailsWithinTheTimeout) {
  SKIP_WITHOUT_A_GPU_PER_RANK();
  expect_the_late_rank_named([](ProcessGroup& group, const Tensor& t) {
    group.all_reduce(t, ReduceOp::sum)->wait();
    group.synchronize();
  });
}

// A host wait other than synchronize(): a tensor read back behind a collective that never
// completes (an eager step's index check or loss is such a read). The group watches the waits
// of the thread that made it (cuda::WaitWatcher): the read ends with the watchdog's error.
TEST(NcclWatchdog, AReadBackBehindAHungCollectiveFailsWithinTheTimeout) {
  SKIP_WITHOUT_A_GPU_PER_RANK();
  expect_the_late_rank_named([](ProcessGroup& group, const Tensor& t) {
    group.all_reduce(t, ReduceOp::sum)->wait();              // the compute stream waits for it
    const std::vector<float> values = t.to_vector<float>();  // the host waits for the compute stream
    if (group.rank() != group.world_size() - 1)              // only the late rank's all-reduce may complete
      ADD_FAILURE() << "the read-back returned " << values.size() << " values on rank " << group.rank()
                    << " behind an all-reduce the late rank had not joined";
  });
}
