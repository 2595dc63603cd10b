// The sm_90a flash-attention forward (ops/cuda/flash_attention_forward_sm90.cu) and its
// wgmma building blocks (ops/cuda/flash_wgmma.cuh), on the GPU:
//  - each product form the forward uses, run on one tile by the forward's own code path
//    (ops/cuda/flash_wgmma_probe.cu) against a CPU product in f64 of the same 16-bit
//    values, output poisoned with NaN first: S = Q K^T (A and B from shared memory, both
//    K-major) and O = P V (A in registers, converted from score accumulators; B from
//    shared memory, MN-major through the transpose bit), D and N of 64 and 128;
//  - that flash_attention_forward takes the sm_90a kernel on a compute-capability 9.0 GPU
//    (its results are bit for bit those of calling the kernel directly), and that the
//    kernel is not offered on other GPUs;
//  - the sm_90a forward against the reference attention (f64 on the CPU) on odd lengths,
//    causal and not, Tq != Tk, head sizes 64 and 128, every output poisoned first.
// The mma.sync forward's own tests (test_flash_attention_gpu.cpp) then run the sm_90a
// kernel wherever it is taken. Skipped, with the reason, where no GPU is usable, and the
// product and forward checks where the GPU is not compute capability 9.0.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "core/gpu.h"
#include "ops/ops.h"
#include "support/gpu.h"
#include "support/gradcheck.h"
#if PRECIS_WITH_CUDA
#include "ops/cuda/flash_attention.h"
#include "ops/cuda/flash_attention_sm90.h"
#endif

using namespace precis;
using precis::testing::random_f64;

#if PRECIS_WITH_CUDA

namespace {

const Device kGpu = Device::cuda(0);

#define PRECIS_SKIP_WITHOUT_HOPPER()                                                                \
  do {                                                                                              \
    PRECIS_SKIP_WITHOUT_GPU();                                                                      \
    if (cuda_compute_capability(0) != 90)                                                           \
      GTEST_SKIP() << "not a compute-capability 9.0 GPU (sm_" << cuda_compute_capability(0) << ")"; \
  } while (0)

std::vector<double> host_values(const Tensor& t) { return t.to(Device::cpu()).to_vector<double>(); }

// ||got - want|| / ||want||, infinite where got holds a non-finite value (an unwritten NaN).
double relative_error(const std::vector<double>& got, const std::vector<double>& want) {
  EXPECT_EQ(got.size(), want.size());
  double diff = 0, norm = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    diff += (got[i] - want[i]) * (got[i] - want[i]);
    norm += want[i] * want[i];
  }
  return std::sqrt(diff / std::max(norm, 1e-6 * static_cast<double>(want.size())));
}

// Row-major [m, n] = x [m, k] y [k, n], or x y^T with y stored [n, k].
std::vector<double> cpu_product(const std::vector<double>& x, const std::vector<double>& y, int64_t m, int64_t k,
                                int64_t n, bool y_transposed) {
  std::vector<double> out(m * n, 0.0);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j)
      for (int64_t l = 0; l < k; ++l) out[i * n + j] += x[i * k + l] * (y_transposed ? y[j * k + l] : y[l * n + j]);
  return out;
}

// Products of exact 16-bit values accumulated in f32: far below a layout mistake's O(1).
constexpr double kProductBar = 1e-5;

}  // namespace

TEST(FlashWgmmaGpu, ScoresFromSharedMemoryMatchTheCpuProduct) {
  PRECIS_SKIP_WITHOUT_HOPPER();
  uint64_t seed = 10;
  for (DType dtype : {DType::bf16, DType::f16})
    for (int64_t D : {64, 128})
      for (int64_t N : {64, 128}) {
        SCOPED_TRACE(std::string(dtype_name(dtype)) + " D" + std::to_string(D) + " N" + std::to_string(N));
        Tensor a = random_f64({64, D}, ++seed, -2.0, 2.0).to(dtype).to(kGpu);
        Tensor b = random_f64({N, D}, ++seed, -2.0, 2.0).to(dtype).to(kGpu);
        Tensor out = full({64, N}, NAN, DType::f32, kGpu);
        ops::cuda::wgmma_probe_scores(a, b, out);
        EXPECT_LE(relative_error(host_values(out), cpu_product(host_values(a), host_values(b), 64, D, N, true)),
                  kProductBar);
      }
}

TEST(FlashWgmmaGpu, ValuesFromRegisterProbabilitiesMatchTheCpuProduct) {
  PRECIS_SKIP_WITHOUT_HOPPER();
  uint64_t seed = 20;
  for (DType dtype : {DType::bf16, DType::f16})
    for (int64_t D : {64, 128})
      for (int64_t N : {64, 128}) {
        SCOPED_TRACE(std::string(dtype_name(dtype)) + " D" + std::to_string(D) + " N" + std::to_string(N));
        // Probabilities already representable in the 16-bit type, so rounding them in
        // registers changes nothing and the CPU product sees the same values.
        Tensor p = random_f64({64, N}, ++seed, 0.0, 1.0).to(dtype).to(DType::f32).to(kGpu);
        Tensor b = random_f64({N, D}, ++seed, -2.0, 2.0).to(dtype).to(kGpu);
        Tensor out = full({64, D}, NAN, DType::f32, kGpu);
        ops::cuda::wgmma_probe_values(p, b, out);
        EXPECT_LE(relative_error(host_values(out), cpu_product(host_values(p), host_values(b), 64, N, D, false)),
                  kProductBar);
      }
}

TEST(FlashWgmmaGpu, ForwardIsOfferedExactlyOnComputeCapability90) {
  PRECIS_SKIP_WITHOUT_GPU();
  const bool hopper = cuda_compute_capability(0) == 90;
  for (DType dtype : {DType::bf16, DType::f16})
    for (int64_t D : {64, 128})
      EXPECT_EQ(ops::cuda::flash_attention_forward_sm90_supported(empty({1, 1, 8, D}, dtype, kGpu)), hopper)
          << dtype_name(dtype) << " D" << D;
  EXPECT_FALSE(ops::cuda::flash_attention_forward_sm90_supported(empty({1, 1, 8, 64}, DType::f32, kGpu)));
}

TEST(FlashWgmmaGpu, FlashAttentionForwardTakesTheSm90Kernel) {
  PRECIS_SKIP_WITHOUT_HOPPER();
  // The same bits from flash_attention_forward as from the sm_90a kernel called directly
  // (the mma.sync kernel rescales over other key blocks and rounds differently).
  uint64_t seed = 30;
  for (DType dtype : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(dtype));
    const int64_t B = 2, H = 3, T = 300, D = 64;
    auto random = [&] { return random_f64({B, H, T, D}, ++seed, -2.0, 2.0).to(dtype).to(kGpu); };
    Tensor q = random(), k = random(), v = random();
    const double scale = 1.0 / std::sqrt(static_cast<double>(D));
    Tensor out_dispatched = full({B, H, T, D}, NAN, dtype, kGpu), out_direct = full({B, H, T, D}, NAN, dtype, kGpu);
    Tensor lse_dispatched = full({B, H, T}, NAN, DType::f32, kGpu), lse_direct = full({B, H, T}, NAN, DType::f32, kGpu);
    ops::cuda::flash_attention_forward(q, k, v, true, scale, out_dispatched, lse_dispatched);
    ops::cuda::flash_attention_forward_sm90(q, k, v, true, scale, out_direct, lse_direct);
    EXPECT_EQ(host_values(out_dispatched), host_values(out_direct));
    EXPECT_EQ(host_values(lse_dispatched), host_values(lse_direct));
  }
}

TEST(FlashWgmmaGpu, Sm90ForwardMatchesTheReferenceWithEveryOutputWritten) {
  PRECIS_SKIP_WITHOUT_HOPPER();
  struct Case {
    int64_t B, H, Tq, Tk;
  };
  const std::vector<Case> cases = {{2, 3, 1, 1},     {2, 3, 17, 17},  {2, 3, 64, 64},  {2, 3, 129, 129},
                                   {2, 3, 257, 257}, {1, 2, 33, 300}, {1, 2, 300, 33}, {1, 2, 1000, 1000}};
  uint64_t seed = 40;
  for (DType dtype : {DType::bf16, DType::f16})
    for (int64_t D : {64, 128})
      for (bool causal : {false, true})
        for (const Case& c : cases) {
          SCOPED_TRACE(std::string(dtype_name(dtype)) + " D" + std::to_string(D) + " Tq" + std::to_string(c.Tq) +
                       " Tk" + std::to_string(c.Tk) + (causal ? " causal" : ""));
          auto random = [&](int64_t T) { return random_f64({c.B, c.H, T, D}, ++seed, -2.0, 2.0).to(dtype).to(kGpu); };
          Tensor q = random(c.Tq), k = random(c.Tk), v = random(c.Tk);
          const double scale = 1.0 / std::sqrt(static_cast<double>(D));
          // A strided output, as the model's [B, T, H, D] buffer viewed [B, H, T, D].
          Tensor out = full({c.B, c.Tq, c.H, D}, NAN, dtype, kGpu).transpose(1, 2);
          Tensor lse = full({c.B, c.H, c.Tq}, NAN, DType::f32, kGpu);
          ops::cuda::flash_attention_forward_sm90(q, k, v, causal, scale, out, lse);

          Tensor q64 = q.to(Device::cpu()).to(DType::f64), k64 = k.to(Device::cpu()).to(DType::f64),
                 v64 = v.to(Device::cpu()).to(DType::f64);
          Tensor want = ops::scaled_dot_product_attention(q64, k64, v64, causal, 0.0, std::nullopt, nullptr,
                                                          ops::AttentionImpl::reference);
          Tensor scores = ops::mul(ops::matmul(q64, k64.transpose(-2, -1)), scale);
          if (causal)
            scores = ops::masked_fill(
                scores, ops::causal_mask(std::max(c.Tq, c.Tk), Device::cpu()).narrow(0, 0, c.Tq).narrow(1, 0, c.Tk),
                -INFINITY);
          Tensor row_max = ops::amax(scores, {-1}, true);
          Tensor want_lse =
              ops::add(ops::log(ops::sum(ops::exp(ops::sub(scores, row_max)), {-1})), row_max.squeeze(-1));
          EXPECT_LE(relative_error(host_values(out), host_values(want)), dtype == DType::bf16 ? 1e-2 : 5e-3);
          EXPECT_LE(relative_error(host_values(lse), host_values(want_lse)), 1e-4);
        }
}

#endif  // PRECIS_WITH_CUDA
