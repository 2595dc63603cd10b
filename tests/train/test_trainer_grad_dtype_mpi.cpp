// bf16-pure with bf16 gradients (precision.grad_dtype) reduced in bf16 (its grad_reduce) under
// data parallelism (MPI backend, CPU), run by mpirun on N ranks: DDP and ZeRO-1 on B rows a
// rank train as one process on N*B rows within bf16's rounding, every rank holding the same
// parameters; the reducer reduces the bf16 gradient buffer in place (no staging buffer), where
// f32 gradients reduced in bf16 are cast into one.
#include <gtest/gtest.h>

#include <cmath>

#include "trainer_mpi.h"

using namespace precis;
using namespace precis::testing;  // NOLINT: the test helpers of this folder and support/

namespace {

int rank() { return mpi_world().rank(); }
int world_size() { return mpi_world().world_size(); }

const TrainerMpiFiles files("precis_trainer_grad_dtype");

// The tiny config under bf16-pure with gradients of `grad_dtype`, distributed.zero `zero`.
train::TrainConfig config_of(const std::string& name, int64_t zero, int64_t rows, DType grad_dtype,
                             bool per_rank = false) {
  train::TrainConfig config = files.tiny_config(files.fresh_dir(name, per_rank), rows, /*accum=*/1);
  config.precision.policy = amp::PrecisionPolicy::preset("bf16-pure");
  config.precision.policy.grad_dtype = grad_dtype;
  config.distributed.zero = zero;
  return config;
}

double mean_abs_difference(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double sum = 0;
  for (size_t i = 0; i < a.size(); ++i) sum += std::abs(static_cast<double>(a[i]) - static_cast<double>(b[i]));
  return a.empty() ? 0.0 : sum / static_cast<double>(a.size());
}

void expect_trains_as_one_process(int64_t zero) {
  train::Trainer parallel(config_of("parallel", zero, 2, DType::bf16), mpi_world_group());
  ASSERT_NE(parallel.reducer(), nullptr);
  EXPECT_FALSE(parallel.reducer()->stages()) << "bf16 gradients reduced in bf16 are reduced where they lie";
  parallel.run();
  train::Trainer reference(config_of("reference", 0, 2 * world_size(), DType::bf16, /*per_rank=*/true), nullptr);
  reference.run();

  ASSERT_EQ(parallel.losses().size(), reference.losses().size());
  // The ranks' bf16 gradients, each divided by N and summed in bf16, are the one process's to
  // a few bf16 roundings (2^-9 relative each); AdamW turns that into updates apart by about that
  // fraction of lr (1e-2), which bf16 parameters round alike but for the odd one: the losses of
  // 4 steps stay within 0.5%, the parameters within 1e-3 on average (an update is ~1e-2).
  for (size_t i = 0; i < reference.losses().size(); ++i)
    EXPECT_NEAR(parallel.losses()[i], reference.losses()[i], 5e-3 * std::abs(reference.losses()[i]))
        << "step " << i + 1;
  EXPECT_LT(mean_abs_difference(parameters_of(parallel), parameters_of(reference)), 1e-3);
  EXPECT_TRUE(same_on_every_rank(parameters_of(parallel))) << "rank " << rank();
}

}  // namespace

TEST(TrainerGradDtype, DdpWithBf16GradientsTrainsAsOneProcess) { expect_trains_as_one_process(/*zero=*/0); }

TEST(TrainerGradDtype, Zero1WithBf16GradientsTrainsAsOneProcess) { expect_trains_as_one_process(/*zero=*/1); }

TEST(TrainerGradDtype, F32GradientsReducedInBf16AreStaged) {
  train::Trainer staged(config_of("staged", 0, 2, DType::f32), mpi_world_group());
  ASSERT_NE(staged.reducer(), nullptr);
  EXPECT_TRUE(staged.reducer()->stages());
}
