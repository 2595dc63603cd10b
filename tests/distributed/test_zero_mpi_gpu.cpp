// ZeRO-1's pieces over NCCL, one rank per GPU, run by `mpirun -np 2` on a machine with
// 2 GPUs (ctest: distributed_test_zero_mpi_gpu_np2): the in-place all_gather and
// reduce_scatter ZeRO-1 issues give the exact results; the tiny model (zero_runs.h)
// trained under ZeRO-1 equals DDP on the same GPUs in f32 and with bf16 parameters
// (f32 master copies sharded, gradients reduced in bf16), the grad norm's sum over
// the shards included; the state gathered from the GPUs' shards is DDP's; gradients
// reduced in bf16/f16, read from the reducer's staging, step as their f32 widening does;
// the same with the parameter buffer in memory registered with NCCL (the trainer's), whose
// buffers may outlive their group; the fused gather (the optimizer storing into every rank's
// parameters) leaves the same bits as the all-gather, and SGD is refused it.
#include <gtest/gtest.h>

#include "core/copy.h"
#include "distributed/collective_inputs.h"
#include "distributed/gpu_ranks.h"
#include "zero_runs.h"

using namespace precis;
using namespace precis::testing;  // NOLINT: the test helpers of this folder and support/
using distributed::ReduceOp;

namespace {

RunOptions on_gpus(DType dtype, std::optional<DType> reduce_dtype = std::nullopt) {
  return {.group = nccl_world(), .dtype = dtype, .reduce_dtype = reduce_dtype};
}

}  // namespace

// Every rank's chunk of `gathered` (world x chunk elements) after an in-place all-gather of
// the rank's own inputs: each rank's exact values.
void expect_in_place_all_gather(distributed::ProcessGroup& group, Tensor gathered, int64_t chunk) {
  const int rank = group.rank();
  fill_(gathered, -99.0);
  Tensor mine = gathered.slice(0, rank * chunk, (rank + 1) * chunk);
  copy_(mine, input_tensor(gathered.dtype(), rank, chunk, my_gpu()));
  group.all_gather(gathered, mine)->wait();
  std::vector<double> expected;
  for (int r = 0; r < group.world_size(); ++r)
    for (double v : input_values(r, chunk)) expected.push_back(v);
  EXPECT_EQ(gathered.to_vector<double>(), expected) << gathered.dtype();
}

TEST(NcclZero1, InPlaceAllGatherAndReduceScatterUseThisRanksChunk) {
  SKIP_WITHOUT_A_GPU_PER_RANK();
  distributed::ProcessGroup& group = *nccl_world();
  const int64_t chunk = 29;
  const int world = group.world_size(), rank = group.rank();
  for (DType dtype : {DType::f32, DType::bf16}) {
    expect_in_place_all_gather(group, empty({world * chunk}, dtype, my_gpu()), chunk);

    for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg}) {
      Tensor input = input_tensor(dtype, rank, chunk * world, my_gpu());
      group.reduce_scatter(input.slice(0, rank * chunk, (rank + 1) * chunk), input, op)->wait();
      std::vector<double> all = reduced_values(chunk * world, op, world), got = input.to_vector<double>();
      EXPECT_EQ(std::vector<double>(got.begin() + rank * chunk, got.begin() + (rank + 1) * chunk),
                std::vector<double>(all.begin() + rank * chunk, all.begin() + (rank + 1) * chunk))
          << dtype << " " << distributed::reduce_op_name(op);
    }
  }
  mpi_barrier();
}

TEST(NcclZero1, RegisteredMemoryGathersInPlaceAndOutlivesItsGroup) {
  SKIP_WITHOUT_A_GPU_PER_RANK();
  // A group of its own (collective: every rank makes it here), destroyed before its buffer.
  std::shared_ptr<distributed::ProcessGroup> group =
      distributed::init_process_group(launch(), distributed::Backend::nccl, my_gpu());
  std::shared_ptr<Allocator> registered = group->registered_allocator();
  ASSERT_TRUE(registered);
  EXPECT_EQ(registered->device(), my_gpu());
  const int64_t chunk = 1 << 20;  // 1 Mi elements a rank: large enough for NCCL's ring
  Tensor survivor;
  for (DType dtype : {DType::f32, DType::bf16}) {
    Tensor gathered = empty_from(registered, {group->world_size() * chunk}, dtype);
    expect_in_place_all_gather(*group, gathered, chunk);
    survivor = gathered;
  }
  const size_t bytes = static_cast<size_t>(group->world_size() * chunk) * element_size(DType::bf16);
  EXPECT_EQ(registered->stats().allocated_bytes, bytes);  // the f32 buffer went back
  group->synchronize();
  group.reset();        // deregisters the survivor and destroys the communicator
  survivor = Tensor();  // then only its memory goes back
  EXPECT_EQ(registered->stats().allocated_bytes, 0u);
  mpi_barrier();
}

TEST(NcclZero1, EqualsDdpWithParametersInRegisteredMemory) {
  SKIP_WITHOUT_A_GPU_PER_RANK();
  // As EqualsDdpInF32 and EqualsDdpWithBf16ParametersReducedInBf16 below: only the memory differs.
  RunOptions f32 = on_gpus(DType::f32), bf16 = on_gpus(DType::bf16, DType::bf16);
  f32.registered_params = bf16.registered_params = true;
  expect_zero_equals_ddp(f32, 1e-5);
  expect_zero_equals_ddp(bf16, 2e-2);
  mpi_barrier();
}

namespace {

// ZeRO-1 with the fused gather against the all-gather, on the same registered memory: the same
// updates reach every rank either way (the optimizer's arithmetic is the same), so the
// parameters agree bit for bit, on every rank. On GPUs that cannot store into each other's
// memory the fused gather is refused with the reason, and the test says so.
void expect_fused_gather_changes_no_bit(RunOptions options) {
  options.registered_params = true;
  RunOptions fused = options;
  fused.fused_gather = true;
  ZeroRun plain_run(options), fused_run(fused);
  if (!fused_run.zero->gather_fused()) {
    ASSERT_NE(fused_run.fused_gather_unavailable.find("NVLink node"), std::string::npos)
        << "refused for another reason: " << fused_run.fused_gather_unavailable;
    GTEST_SKIP() << "fused gather not possible here: " << fused_run.fused_gather_unavailable;
  }
  for (int step = 0; step < 4; ++step) {
    EXPECT_EQ(fused_run.step(step), plain_run.step(step)) << "step " << step;
    const std::vector<Tensor> p = fused_run.model.parameters(), q = plain_run.model.parameters();
    for (size_t i = 0; i < p.size(); ++i)
      EXPECT_EQ(p[i].to_vector<double>(), q[i].to_vector<double>()) << "step " << step << " parameter " << i;
  }
  for (const Tensor& p : fused_run.model.parameters()) {  // every rank holds rank 0's values
    Tensor rank0 = p.detach().clone();
    options.group->broadcast(rank0, 0)->wait();
    EXPECT_EQ(p.to_vector<double>(), rank0.to_vector<double>()) << "rank " << options.group->rank();
  }
}

}  // namespace

TEST(NcclZero1, FusedGatherStoresTheAllGathersValues) {
  SKIP_WITHOUT_A_GPU_PER_RANK();
  expect_fused_gather_changes_no_bit(on_gpus(DType::f32));
  expect_fused_gather_changes_no_bit(on_gpus(DType::bf16, DType::bf16));  // bf16 stores, f32 masters
  mpi_barrier();
}

TEST(NcclZero1, FusedGatherIsRefusedForSgd) {
  SKIP_WITHOUT_A_GPU_PER_RANK();
  RunOptions options = on_gpus(DType::f32);
  options.registered_params = options.fused_gather = options.sgd = true;
  ZeroRun run(options);
  EXPECT_FALSE(run.zero->gather_fused());
  EXPECT_NE(run.fused_gather_unavailable.find("AdamW"), std::string::npos) << run.fused_gather_unavailable;
  run.step(0);  // the all-gather serves it
  mpi_barrier();
}

TEST(NcclZero1, EqualsDdpInF32) {
  SKIP_WITHOUT_A_GPU_PER_RANK();
  // The same per-rank gradients reduced in another order, the norm summed by shards: round-off.
  expect_zero_equals_ddp(on_gpus(DType::f32), 1e-5);
  mpi_barrier();
}

TEST(NcclZero1, EqualsDdpWithBf16ParametersReducedInBf16) {
  SKIP_WITHOUT_A_GPU_PER_RANK();
  // A gradient reduced in bf16 in another order may differ by a bf16 ulp, and a parameter
  // rounded from its f32 master by one (4e-3 relative); a wrong shard would be off by far more.
  expect_zero_equals_ddp(on_gpus(DType::bf16, DType::bf16), 2e-2);
  mpi_barrier();
}

TEST(NcclZero1, GradientsReducedInBf16AreReadInPlaceAsWidened) {
  SKIP_WITHOUT_A_GPU_PER_RANK();
  // The norm's f64 sum of squares may add the 16-bit and the f32 chunks in another order on
  // the GPU (their loads are of 8 and 4 elements): round-off in its last bits, so the clip
  // factor may differ by an f32 ulp and move some updates by an ulp. 1e-7 relative admits such
  // flips (an ulp is 6e-8 of a value) and little more: a scaled gradient rounded to bf16 (8
  // bits of mantissa, not f32's 24; round_scaled_grads_to_f32 prevents it) errs by ~1e-3 of it.
  constexpr double kNorm = 1e-14, kParams = 1e-7;
  expect_staged_grads_step_as_widened(on_gpus(DType::f32, DType::bf16), kNorm, kParams);
  expect_staged_grads_step_as_widened(on_gpus(DType::bf16, DType::bf16), kNorm, kParams);
  RunOptions sgd = on_gpus(DType::f32, DType::f16);
  sgd.sgd = true;
  expect_staged_grads_step_as_widened(sgd, kNorm, kParams);
  mpi_barrier();
}

TEST(NcclZero1, GatheredStateWithBf16MasterCopiesIsDdps) {
  SKIP_WITHOUT_A_GPU_PER_RANK();
  expect_gathered_state_is_ddps(on_gpus(DType::bf16), 2e-2);
  expect_gathered_state_is_ddps(on_gpus(DType::f32), 1e-5);
  mpi_barrier();
}
