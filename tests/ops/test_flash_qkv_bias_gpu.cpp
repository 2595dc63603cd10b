// The qkv product's bias gradient made by the flash-attention backward (FlashGradSums in
// ops/cuda/flash_attention.h; flash_attention_packed's qkv_bias in ops/nn_functional.h):
// the column sums of the d(qkv) its kernels wrote, against an exact float64 sum of those very
// values and against column_sums (ops/cuda/column_sums.h, the separate pass it replaces) run
// on them. The two sum the same 16-bit values in f32 in different orders, so they need not
// agree to the bit; each must lie within the f32 summation bound of the exact sum:
//   |computed - exact| <= (n + 1) 2^-24 (sum |x| + |init|) + u (|exact| + that),
// n = B T values per column (any order of n - 1 f32 additions, plus the one into the old
// value), u the output dtype's unit roundoff (2^-24 f32, 2^-8 bf16, 2^-11 f16: the one
// rounding at the end; f16 near zero adds half its subnormal spacing). Cases: f32 and 16-bit sums, written over and
// added to (accumulation across micro-steps), head sizes 64 (the sm_90a kernel on Hopper) and 128 (the mma.sync
// kernel), causal and not, T not a multiple of any block (1, 33, 77, 300), B T odd; sums NaN-poisoned when written
// over, so a column left unwritten fails. The sums are the same bits on every run wherever d(qkv) is (dK, dV always;
// dQ's f32 sums take atomics on the mma.sync kernel). Through the op: into a 16-bit or f32 .grad (the engine's
// destination, precision.grad_dtype) written over, then added to, and returned to a fresh
// leaf. Skipped, with the reason, where no GPU is usable.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "core/copy.h"
#include "ops/ops.h"
#include "support/gpu.h"
#include "support/gpu_compare.h"
#include "support/gradcheck.h"
#if PRECIS_WITH_CUDA
#include "ops/cuda/column_sums.h"
#include "ops/cuda/flash_attention.h"
#endif

using namespace precis;
using precis::testing::kGpu;
using precis::testing::kNaN;
using precis::testing::random_f64;

#if PRECIS_WITH_CUDA

namespace {

std::vector<double> host(const Tensor& t) { return t.to(Device::cpu()).to(DType::f64).to_vector<double>(); }

double unit_roundoff(DType dtype) {
  return dtype == DType::f32 ? std::ldexp(1.0, -24) : dtype == DType::bf16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);
}

// Checks sums ([cols], `dtype`) against init (the old values, when `accumulate`) plus the
// column sums of g ([rows, cols]) in float64, within the bound of the top comment.
void expect_column_sums(const Tensor& sums, const Tensor& g, const Tensor& init, bool accumulate,
                        const std::string& what) {
  const int64_t rows = g.size(0), cols = g.size(1);
  const std::vector<double> got = host(sums), values = host(g), old = accumulate ? host(init) : std::vector<double>();
  ASSERT_EQ(static_cast<int64_t>(got.size()), cols) << what;
  int misses = 0;
  for (int64_t c = 0; c < cols && misses < 5; ++c) {
    double exact = accumulate ? old[c] : 0.0, magnitude = accumulate ? std::fabs(old[c]) : 0.0;
    for (int64_t r = 0; r < rows; ++r) {
      exact += values[r * cols + c];
      magnitude += std::fabs(values[r * cols + c]);
    }
    const double f32_error = static_cast<double>(rows + 1) * std::ldexp(1.0, -24) * magnitude;
    // (f16 sums also round to its subnormal spacing, 2^-24, near zero.)
    const double absolute = sums.dtype() == DType::f16 ? std::ldexp(1.0, -25) : 0.0;
    const double bound = f32_error + unit_roundoff(sums.dtype()) * (std::fabs(exact) + f32_error) + absolute;
    if (!(std::fabs(got[c] - exact) <= bound)) {
      ADD_FAILURE() << what << ": column " << c << " is " << got[c] << ", exact " << exact << ", bound " << bound;
      ++misses;
    }
  }
}

// The [B, H, T, D] view of part `part` (0 q, 1 k, 2 v) of a [B, T, 3 H D] tensor.
Tensor head_part(const Tensor& qkv, int64_t part, int64_t H) {
  const int64_t B = qkv.size(0), T = qkv.size(1), C = qkv.size(2) / 3;
  return qkv.narrow(2, part * C, C).view({B, T, H, C / H}).transpose(1, 2);
}

}  // namespace

TEST(FlashQkvBiasGpu, KernelSumsAreTheColumnSumsOfTheWrittenGradients) {
  PRECIS_SKIP_WITHOUT_GPU();
  struct Case {
    int64_t B, T;
  };
  // B T odd (77, 99, 1); T past whole key blocks (128) and dQ row blocks (128), and under one.
  const Case cases[] = {{1, 77}, {3, 33}, {2, 300}, {1, 1}};
  const int64_t H = 2;
  uint64_t seed = 1;
  for (DType dtype : {DType::bf16, DType::f16})
    for (int64_t D : {64, 128})
      for (bool causal : {true, false})
        for (const Case& c : cases) {
          const int64_t C = H * D, B = c.B, T = c.T;
          const std::string shape = std::string(dtype_name(dtype)) + " D" + std::to_string(D) +
                                    (causal ? " causal" : "") + " B" + std::to_string(B) + " T" + std::to_string(T);
          const Tensor qkv = random_f64({B, T, 3 * C}, ++seed, -2.0, 2.0).to(dtype).to(kGpu);
          const Tensor q = head_part(qkv, 0, H), k = head_part(qkv, 1, H), v = head_part(qkv, 2, H);
          const Tensor dy = random_f64({B, T, C}, ++seed).to(dtype).to(kGpu);
          const Tensor dout = dy.view({B, T, H, D}).transpose(1, 2);
          const double scale = 1.0 / std::sqrt(static_cast<double>(D));
          Tensor y = empty({B, T, C}, dtype, kGpu), lse = empty({B, H, T}, DType::f32, kGpu);
          const Tensor out = y.view({B, T, H, D}).transpose(1, 2);
          ops::cuda::flash_attention_forward(q, k, v, causal, scale, out, lse);
          for (DType sums_dtype : {DType::f32, dtype})
            for (bool accumulate : {false, true}) {
              const std::string what =
                  shape + ", " + dtype_name(sums_dtype) + " sums" + (accumulate ? ", added" : ", written");
              const Tensor init = accumulate ? random_f64({3 * C}, ++seed, -4.0, 4.0).to(sums_dtype).to(kGpu)
                                             : full({3 * C}, kNaN, sums_dtype, kGpu);
              // The backward with sums; returns d(qkv) and the sums.
              auto backward = [&] {
                Tensor dqkv = full({B, T, 3 * C}, kNaN, dtype, kGpu), sums = init.clone();
                ops::cuda::flash_attention_backward(q, k, v, out, lse, dout, causal, scale, head_part(dqkv, 0, H),
                                                    head_part(dqkv, 1, H), head_part(dqkv, 2, H), {sums, accumulate});
                return std::vector<Tensor>{dqkv.view({B * T, 3 * C}), sums};
              };
              const std::vector<Tensor> fused = backward();
              Tensor separate = init.clone();
              ops::cuda::column_sums(separate, fused[0], accumulate);
              expect_column_sums(fused[1], fused[0], init, accumulate, what + ": fused");
              expect_column_sums(separate, fused[0], init, accumulate, what + ": column_sums (the bound's check)");

              // The same bits on every run, wherever d(qkv) came out the same.
              const std::vector<Tensor> again = backward();
              const std::vector<double> g1 = host(fused[0]), g2 = host(again[0]), s1 = host(fused[1]),
                                        s2 = host(again[1]);
              bool dq_same = true;
              for (int64_t r = 0; r < B * T && dq_same; ++r)
                for (int64_t col = 0; col < C; ++col) dq_same = dq_same && g1[r * 3 * C + col] == g2[r * 3 * C + col];
              for (int64_t col = dq_same ? 0 : C; col < 3 * C; ++col)
                EXPECT_EQ(s1[col], s2[col]) << what << ": column " << col << " changed from one run to the next";
            }
        }
}

TEST(FlashQkvBiasGpu, PackedOpWritesTheBiasGradientIntoItsGradOrReturnsIt) {
  PRECIS_SKIP_WITHOUT_GPU();
  const int64_t B = 3, T = 77, H = 2, D = 64, C = H * D;  // B T = 231: odd; T past no block boundary
  uint64_t seed = 100;
  // One backward of flash_attention_packed with `bias` as qkv_bias; returns d(qkv) as [B T, 3C].
  auto backward = [&](const Tensor& bias) {
    Tensor qkv = random_f64({B, T, 3 * C}, ++seed, -2.0, 2.0).to(DType::bf16).to(kGpu).set_requires_grad();
    Tensor y = ops::flash_attention_packed(qkv, H, true, bias);
    y.backward(random_f64({B, T, C}, ++seed).to(DType::bf16).to(kGpu));
    return qkv.grad().view({B * T, 3 * C});
  };
  // A bf16 parameter whose .grad (f32 or bf16: precision.grad_dtype) is offered to the op:
  // stale first (written over), then held (added to), as across two micro-steps.
  for (DType grad_dtype : {DType::f32, DType::bf16}) {
    const std::string what = std::string(dtype_name(grad_dtype)) + " .grad";
    Tensor bias = random_f64({3 * C}, ++seed).to(DType::bf16).to(kGpu).set_requires_grad();
    const Tensor grad = full({3 * C}, kNaN, grad_dtype, kGpu);
    bias.set_grad(grad);
    bias.impl()->grad_is_stale = true;
    // Read from `grad` itself: the gradient must land where the .grad lay (an f32 .grad that
    // got the op's bf16 gradient copied in instead would miss the f32 bound).
    const Tensor g1 = backward(bias);
    expect_column_sums(grad, g1, Tensor(), false, what + ", written over");
    const Tensor first = grad.clone();
    const Tensor g2 = backward(bias);
    expect_column_sums(grad, g2, first, true, what + ", added to");
  }
  // A fresh leaf: the op returns the gradient in bf16.
  Tensor leaf = random_f64({3 * C}, ++seed).to(DType::bf16).to(kGpu).set_requires_grad();
  const Tensor g = backward(leaf);
  ASSERT_TRUE(leaf.grad().defined());
  EXPECT_EQ(leaf.grad().dtype(), DType::bf16);
  expect_column_sums(leaf.grad(), g, Tensor(), false, "fresh leaf");
}

#else

TEST(FlashQkvBiasGpu, NeedsACudaBuild) { GTEST_SKIP() << "built without CUDA (PRECIS_CUDA=OFF)"; }

#endif  // PRECIS_WITH_CUDA
