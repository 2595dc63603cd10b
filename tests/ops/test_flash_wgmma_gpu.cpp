// The sm_90a flash-attention forward and backward (ops/cuda/flash_attention_*_sm90.cu) and their
// wgmma building blocks (ops/cuda/flash_wgmma.cuh), on the GPU:
//  - each product form the forward uses, run on one tile by the forward's own code path
//    (tests/ops/flash_wgmma_probe.cu) against a CPU product in f64 of the same 16-bit
//    values, output poisoned with NaN first: S = Q K^T (A and B from shared memory, both
//    K-major) and O = P V (A in registers, converted from score accumulators; B from
//    shared memory, MN-major through the transpose bit), D and N of 64 and 128;
//  - that flash_attention_forward takes the sm_90a kernel on a compute-capability 9.0 GPU
//    (its results are bit for bit those of calling the kernel directly), and that the
//    kernel is not offered on other GPUs;
//  - the sm_90a forward against the reference attention (f64 on the CPU) on odd lengths,
//    causal and not, Tq != Tk, head sizes 64 and 128, every output poisoned first;
//  - the backward's dQ product (A = dS^T stored from registers and read transposed, B = K
//    read MN-major from a column offset) against a CPU product; that
//    flash_attention_backward takes the sm_90a backward at head size 64 on compute
//    capability 9.0 (dK, dV bit for bit those of calling it directly); the sm_90a backward
//    against the reference gradients (f64 autograd on the CPU) on the forward's lengths,
//    head size 64, every gradient poisoned first, dK and dV the same bits run after run.
// The mma.sync kernels' own tests (test_flash_attention_gpu.cpp) then run the sm_90a
// kernels wherever they are taken. Skipped, with the reason, where no GPU is usable, and the
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
#include "ops/flash_wgmma_probe.h"
#endif

using namespace precis;
using precis::testing::random_f64;

#if PRECIS_WITH_CUDA

namespace {

const Device kGpu = Device::cuda(0);

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

TEST(FlashWgmmaGpu, TransposedProductFromSharedMemoryMatchesTheCpuProduct) {
  PRECIS_SKIP_WITHOUT_HOPPER();
  uint64_t seed = 50;
  for (DType dtype : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(dtype));
    // a = dS^T [keys, queries], already representable in the 16-bit type (rounded in registers).
    Tensor a = random_f64({128, 64}, ++seed, -2.0, 2.0).to(dtype).to(DType::f32).to(kGpu);
    Tensor b = random_f64({128, 64}, ++seed, -2.0, 2.0).to(dtype).to(kGpu);
    Tensor out = full({64, 64}, NAN, DType::f32, kGpu);
    ops::cuda::wgmma_probe_transposed(a, b, out);
    std::vector<double> a_host = host_values(a), a_transposed(64 * 128);
    for (int64_t key = 0; key < 128; ++key)
      for (int64_t query = 0; query < 64; ++query) a_transposed[query * 128 + key] = a_host[key * 64 + query];
    EXPECT_LE(relative_error(host_values(out), cpu_product(a_transposed, host_values(b), 64, 128, 64, false)),
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

TEST(FlashWgmmaGpu, BackwardIsOfferedExactlyOnComputeCapability90AtHeadSize64) {
  PRECIS_SKIP_WITHOUT_GPU();
  const bool hopper = cuda_compute_capability(0) == 90;
  for (DType dtype : {DType::bf16, DType::f16}) {
    EXPECT_EQ(ops::cuda::flash_attention_backward_sm90_supported(empty({1, 1, 8, 64}, dtype, kGpu)), hopper)
        << dtype_name(dtype);
    EXPECT_FALSE(ops::cuda::flash_attention_backward_sm90_supported(empty({1, 1, 8, 128}, dtype, kGpu)))
        << dtype_name(dtype);
  }
  EXPECT_FALSE(ops::cuda::flash_attention_backward_sm90_supported(empty({1, 1, 8, 64}, DType::f32, kGpu)));
}

namespace {

// A [B, T, H, D] buffer of NaN viewed [B, H, T, D], as the model's gradients are.
Tensor poisoned_heads(int64_t B, int64_t H, int64_t T, int64_t D, DType dtype) {
  return full({B, T, H, D}, NAN, dtype, kGpu).transpose(1, 2);
}

}  // namespace

TEST(FlashWgmmaGpu, FlashAttentionBackwardTakesTheSm90Kernel) {
  PRECIS_SKIP_WITHOUT_HOPPER();
  // dK and dV bit for bit those of calling the sm_90a backward directly (dQ's atomic sums
  // may differ in the last bits; the mma.sync kernel rounds P and sums differently).
  uint64_t seed = 60;
  for (DType dtype : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(dtype));
    const int64_t B = 2, H = 3, T = 300, D = 64;
    auto random = [&] { return random_f64({B, H, T, D}, ++seed, -2.0, 2.0).to(dtype).to(kGpu); };
    Tensor q = random(), k = random(), v = random(), dout = random();
    const double scale = 1.0 / std::sqrt(static_cast<double>(D));
    Tensor out = empty({B, H, T, D}, dtype, kGpu), lse = empty({B, H, T}, DType::f32, kGpu);
    ops::cuda::flash_attention_forward(q, k, v, true, scale, out, lse);
    std::vector<Tensor> dispatched, direct;
    for (int i = 0; i < 3; ++i) {
      dispatched.push_back(poisoned_heads(B, H, T, D, dtype));
      direct.push_back(poisoned_heads(B, H, T, D, dtype));
    }
    ops::cuda::flash_attention_backward(q, k, v, out, lse, dout, true, scale, dispatched[0], dispatched[1],
                                        dispatched[2]);
    ops::cuda::flash_attention_backward_sm90(q, k, v, out, lse, dout, true, scale, direct[0], direct[1], direct[2]);
    EXPECT_LE(relative_error(host_values(dispatched[0]), host_values(direct[0])), 1e-3) << "dq";
    EXPECT_EQ(host_values(dispatched[1]), host_values(direct[1])) << "dk";
    EXPECT_EQ(host_values(dispatched[2]), host_values(direct[2])) << "dv";
  }
}

TEST(FlashWgmmaGpu, Sm90BackwardMatchesTheReferenceWithEveryGradientWritten) {
  PRECIS_SKIP_WITHOUT_HOPPER();
  struct Case {
    int64_t B, H, Tq, Tk;
  };
  // Odd lengths (tails of the 64-query and 128-key blocks, whose dQ rows the kernel adds
  // in whole rows), Tq != Tk, 1 to 5 query blocks per key block (the pipeline's first and
  // last steps: 64 one, 100 two, 129 three), and 700: 11 query blocks per key block, so the
  // three query-block stages and the two dS^T and dQ tiles wrap around many times.
  const std::vector<Case> cases = {{2, 3, 1, 1},     {2, 3, 17, 17},   {2, 3, 64, 64},
                                   {2, 3, 100, 100}, {2, 3, 129, 129}, {2, 3, 257, 257},
                                   {1, 2, 33, 300},  {1, 2, 300, 33},  {1, 2, 700, 700}};
  const int64_t D = 64;
  uint64_t seed = 70;
  for (DType dtype : {DType::bf16, DType::f16})
    for (bool causal : {false, true})
      for (const Case& c : cases) {
        SCOPED_TRACE(std::string(dtype_name(dtype)) + " Tq" + std::to_string(c.Tq) + " Tk" + std::to_string(c.Tk) +
                     (causal ? " causal" : ""));
        auto random = [&](int64_t T) { return random_f64({c.B, c.H, T, D}, ++seed, -2.0, 2.0).to(dtype).to(kGpu); };
        Tensor q = random(c.Tq), k = random(c.Tk), v = random(c.Tk), dout = random(c.Tq);
        const double scale = 1.0 / std::sqrt(static_cast<double>(D));
        Tensor out = empty({c.B, c.H, c.Tq, D}, dtype, kGpu), lse = empty({c.B, c.H, c.Tq}, DType::f32, kGpu);
        ops::cuda::flash_attention_forward(q, k, v, causal, scale, out, lse);
        auto backward = [&] {
          std::vector<Tensor> grads{poisoned_heads(c.B, c.H, c.Tq, D, dtype), poisoned_heads(c.B, c.H, c.Tk, D, dtype),
                                    poisoned_heads(c.B, c.H, c.Tk, D, dtype)};
          ops::cuda::flash_attention_backward_sm90(q, k, v, out, lse, dout, causal, scale, grads[0], grads[1],
                                                   grads[2]);
          return grads;
        };
        std::vector<Tensor> grads = backward();

        Tensor q64 = q.to(Device::cpu()).to(DType::f64), k64 = k.to(Device::cpu()).to(DType::f64),
               v64 = v.to(Device::cpu()).to(DType::f64);
        q64.set_requires_grad();
        k64.set_requires_grad();
        v64.set_requires_grad();
        ops::scaled_dot_product_attention(q64, k64, v64, causal, 0.0, std::nullopt, nullptr,
                                          ops::AttentionImpl::reference)
            .backward(dout.to(Device::cpu()).to(DType::f64));
        const double bar = dtype == DType::bf16 ? 1e-2 : 5e-3;
        EXPECT_LE(relative_error(host_values(grads[0]), host_values(q64.grad())), bar) << "dq";
        EXPECT_LE(relative_error(host_values(grads[1]), host_values(k64.grad())), bar) << "dk";
        EXPECT_LE(relative_error(host_values(grads[2]), host_values(v64.grad())), bar) << "dv";
        // dK and dV take no atomics: a race between the warpgroups would change bits.
        std::vector<Tensor> again = backward();
        EXPECT_EQ(host_values(again[1]), host_values(grads[1])) << "dk";
        EXPECT_EQ(host_values(again[2]), host_values(grads[2])) << "dv";
      }
}

#endif  // PRECIS_WITH_CUDA
