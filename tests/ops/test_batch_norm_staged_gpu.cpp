// The channels-last batch-norm statistics passes with their loads staged through shared memory
// (ops::cuda::set_staged_batch_norm_statistics, the default; ops/cuda/batch_norm.cu's
// staged_sums_kernel) give the register-batched kernels' results bit for bit:
// each thread sums the same cells in the same order, on the same grid. Forward and backward of
// batch_norm, batch_norm_relu and batch_norm_add_relu in training, f32, f16 and bf16, on tensors
// under 40 MB (where the register-batched pass takes one block an SM, as the staged kernel does): ResNet-18's
// first layer (B=256), a layer of two channel tiles, channels not a multiple of 32 packs, and
// odd spatial sizes. A counter shows that the staged kernel ran. Skipped, with the reason, where
// no GPU is usable.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "ops/batch_norm.h"
#include "ops/ops.h"
#include "support/gpu.h"
#include "support/gpu_compare.h"
#if PRECIS_WITH_CUDA
#include "ops/cuda/batch_norm.h"
#endif

using namespace precis;
using precis::testing::kGpu;
using precis::testing::random_f64;

namespace {

// y, dx, dw, db, dr (batch_norm_add_relu) and the running statistics of one training step of
// `variant` (0 batch_norm, 1 batch_norm_relu, 2 batch_norm_add_relu), widened to f64 on the CPU
// (exact: equal values are equal bits).
std::vector<std::vector<double>> step(int variant, const Shape& shape, DType dtype, uint64_t seed) {
  const int64_t C = shape[1];
  auto input = [&](uint64_t s) {
    return ops::to_memory_format(random_f64(shape, s, -1, 3).to(dtype).to(kGpu), ops::MemoryFormat::channels_last);
  };
  Tensor x = input(seed).set_requires_grad();
  Tensor w = random_f64({C}, seed + 1).to(DType::f32).to(kGpu).set_requires_grad();
  Tensor b = random_f64({C}, seed + 2).to(DType::f32).to(kGpu).set_requires_grad();
  Tensor r = variant == 2 ? input(seed + 3).set_requires_grad() : Tensor();
  Tensor mean = zeros({C}).to(kGpu), var = ones({C}).to(kGpu);
  const Tensor y = variant == 2   ? ops::batch_norm_add_relu(x, r, w, b, mean, var, true, 0.1, 1e-5)
                   : variant == 1 ? ops::batch_norm_relu(x, w, b, mean, var, true, 0.1, 1e-5, Tensor())
                                  : ops::batch_norm(x, w, b, mean, var, true, 0.1, 1e-5, Tensor());
  y.backward(input(seed + 4));
  std::vector<std::vector<double>> values;
  for (const Tensor& t : {y, x.grad(), w.grad(), b.grad(), variant == 2 ? r.grad() : Tensor(), mean, var})
    values.push_back(t.defined() ? t.to(Device::cpu()).to(DType::f64).contiguous().to_vector<double>()
                                 : std::vector<double>());
  return values;
}

}  // namespace

TEST(BatchNormStagedGpu, StatisticsStagedThroughSharedMemoryGiveTheSameBits) {
  PRECIS_SKIP_WITHOUT_GPU();
#if PRECIS_WITH_CUDA
  const char* names[] = {"y", "dx", "dw", "db", "dr", "running mean", "running var"};
  uint64_t seed = 1200;
  for (const Shape& shape :
       {Shape{256, 64, 32, 32}, Shape{32, 512, 4, 4}, Shape{16, 72, 12, 12}, Shape{4, 264, 5, 5}, Shape{3, 16, 9, 7}}) {
    for (DType dtype : {DType::f32, DType::f16, DType::bf16}) {
      if (shape[0] * shape[1] * shape[2] * shape[3] * static_cast<int64_t>(element_size(dtype)) >= (int64_t{40} << 20))
        continue;  // the register-batched pass takes two blocks an SM there: other partials
      for (int variant = 0; variant < 3; ++variant) {
        const std::string what = std::string(variant == 0   ? "batch_norm "
                                             : variant == 1 ? "batch_norm_relu "
                                                            : "batch_norm_add_relu ") +
                                 ::testing::PrintToString(shape) + " " + dtype_name(dtype);
        ops::cuda::set_staged_batch_norm_statistics(false);
        const auto plain = step(variant, shape, dtype, seed);
        ops::cuda::set_staged_batch_norm_statistics(true);
        const int64_t launches = ops::cuda::staged_batch_norm_statistics_launches();
        const auto staged = step(variant, shape, dtype, seed);  // and the default stays on
        EXPECT_EQ(ops::cuda::staged_batch_norm_statistics_launches() - launches, 2)
            << what << ": the forward's and the backward's statistics passes were staged";
        for (size_t i = 0; i < plain.size(); ++i) {
          ASSERT_EQ(staged[i].size(), plain[i].size()) << what << ": " << names[i];
          size_t first = 0;  // the first element that differs
          while (first < plain[i].size() && staged[i][first] == plain[i][first]) ++first;
          EXPECT_EQ(first, plain[i].size()) << what << ": " << names[i] << " differs first at element " << first << ": "
                                            << (first < plain[i].size() ? staged[i][first] : 0.0) << " staged, "
                                            << (first < plain[i].size() ? plain[i][first] : 0.0) << " not";
        }
        seed += 10;
      }
    }
  }
#endif
}
