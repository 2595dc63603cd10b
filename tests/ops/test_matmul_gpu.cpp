// GPU products through cuBLASLt against the CPU: every dtype (f32, TF32, f16,
// bf16) on odd sizes, transposed, padded, misaligned and strided operands,
// broadcast batches, the bias / GELU / bias-gradient epilogues (fused and
// unfused), the GELU gradient fused into the next product (DGELU), linear,
// linear_gelu and linear_gelu_linear forward and backward, and the algorithm
// cache. The CPU reference is computed in float64 from the very values the GPU
// gets. Outputs are filled with NaN first, so an element left unwritten fails.
// Skipped, with the reason, where no GPU is usable.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <limits>
#include <string>

#include "core/copy.h"
#include "ops/autocast.h"
#include "ops/ops.h"
#include "support/gpu.h"
#include "support/gpu_compare.h"
#include "support/gradcheck.h"
#if PRECIS_WITH_CUDA
#include "ops/cuda/matmul.h"
#endif

using namespace precis;
using precis::testing::expect_near_magnitude;
using precis::testing::kGpu;
using precis::testing::kNaN;
using precis::testing::random_f64;

namespace {

// A dtype, whether TF32 is allowed, and the relative tolerance that goes with them.
struct Precision {
  DType dtype;
  bool tf32;
  double tol;
  const char* name;
};
const Precision kPrecisions[] = {{DType::f32, false, 1e-5, "float32"},
                                 {DType::f32, true, 1e-3, "tf32"},
                                 {DType::f16, false, 1e-2, "float16"},
                                 {DType::bf16, false, 1e-2, "bfloat16"}};

// Sets allow_tf32 for a scope, then restores it.
class Tf32Scope {
 public:
  explicit Tf32Scope(bool allow) : previous_(ops::allow_tf32()) { ops::set_allow_tf32(allow); }
  ~Tf32Scope() { ops::set_allow_tf32(previous_); }

 private:
  bool previous_;
};

// Uniform values in [-1, 1) of the dtype, on the host (the CPU reference reads them as float64).
Tensor host_values(const Shape& shape, uint64_t seed, DType dtype) { return random_f64(shape, seed).to(dtype); }

Tensor f64(const Tensor& t) { return t.to(Device::cpu()).to(DType::f64); }

// A GPU tensor full of NaN.
Tensor poisoned(const Shape& shape, DType dtype) {
  Tensor t = empty(shape, dtype, kGpu);
  fill_(t, kNaN);
  return t;
}

// For results an op allocates itself: fills a freed block of that size with NaN,
// which the caching allocator hands to the next allocation of that size.
void poison_next_allocation(const Shape& shape, DType dtype) { poisoned(shape, dtype); }

double max_abs_difference(const Tensor& a, const Tensor& b) {
  std::vector<double> av = f64(a).to_vector<double>(), bv = f64(b).to_vector<double>();
  double most = 0;
  for (size_t i = 0; i < av.size(); ++i) most = std::max(most, std::abs(av[i] - bv[i]));
  return most;
}

std::string label(const Precision& p, int64_t M, int64_t K, int64_t N) {
  return std::string(p.name) + " [" + std::to_string(M) + ", " + std::to_string(K) + "] x [" + std::to_string(K) +
         ", " + std::to_string(N) + "]";
}

const std::vector<std::tuple<int64_t, int64_t, int64_t>> kSizes = {
    {1, 1, 1}, {7, 13, 5}, {33, 17, 65}, {1000, 768, 2304}};

}  // namespace

TEST(MatmulGpu, EveryDtypeMatchesTheCpuOnOddSizes) {
  PRECIS_SKIP_WITHOUT_GPU();
  for (auto [M, K, N] : kSizes) {
    for (const Precision& p : kPrecisions) {
      Tf32Scope tf32(p.tf32);
      Tensor a = host_values({M, K}, 1, p.dtype), b = host_values({K, N}, 2, p.dtype);
      Tensor expected = ops::matmul(f64(a), f64(b));
      poison_next_allocation({M, N}, p.dtype);
      Tensor c = ops::matmul(a.to(kGpu), b.to(kGpu));
      EXPECT_TRUE(c.is_cuda());
      EXPECT_EQ(c.dtype(), p.dtype);
      expect_near_magnitude(c, expected, p.tol, label(p, M, K, N));
    }
  }
}

TEST(MatmulGpu, Tf32ChangesFloatProductsWhenAllowed) {
  PRECIS_SKIP_WITHOUT_GPU();
  Tensor a = host_values({1000, 768}, 3, DType::f32).to(kGpu), b = host_values({768, 2304}, 4, DType::f32).to(kGpu);
  Tensor exact = ops::matmul(a, b);
  Tensor tf32;
  {
    Tf32Scope scope(true);
    tf32 = ops::matmul(a, b);
  }
  // TF32 rounds the inputs to 10 mantissa bits: the result moves, within 1e-3 of its magnitude.
  EXPECT_GT(max_abs_difference(exact, tf32), 0.0) << "allow_tf32 did not reach cuBLASLt";
  expect_near_magnitude(tf32, f64(exact), 1e-3, "tf32 against f32");
}

#if PRECIS_WITH_CUDA
TEST(MatmulGpu, TransposedPaddedMisalignedAndStridedOperands) {
  PRECIS_SKIP_WITHOUT_GPU();
  const int64_t M = 33, K = 17, N = 65;
  for (const Precision& p : kPrecisions) {
    Tf32Scope tf32(p.tf32);
    Tensor a = host_values({M, K}, 5, p.dtype), b = host_values({K, N}, 6, p.dtype);
    Tensor expected = ops::matmul(f64(a), f64(b));
    // Transposed views: columns dense (read with CUBLAS_OP_T, no copy).
    Tensor a_t = a.t().contiguous().to(kGpu).t(), b_t = b.t().contiguous().to(kGpu).t();
    // Row-major with padded rows, starting one element in (pointers aligned to one element only).
    Tensor a_pad = empty({M, K + 3}, p.dtype);
    copy_(a_pad.narrow(1, 1, K), a);
    Tensor a_padded = a_pad.to(kGpu).narrow(1, 1, K);
    // Every other column: neither layout, so copied first.
    Tensor b_wide = empty({K, 2 * N}, p.dtype);
    copy_(b_wide.slice(1, 0, 2 * N, 2), b);
    Tensor b_strided = b_wide.to(kGpu).slice(1, 0, 2 * N, 2);
    const std::pair<Tensor, Tensor> operands[] = {{a_t, b.to(kGpu)},      {a.to(kGpu), b_t}, {a_t, b_t},
                                                  {a_padded, b.to(kGpu)}, {a_padded, b_t},   {a_t, b_strided}};
    int index = 0;
    for (const auto& [ga, gb] : operands) {
      Tensor c = poisoned({M, N}, p.dtype);
      ops::cuda::matmul(c, ga, gb);
      expect_near_magnitude(c, expected, p.tol, label(p, M, K, N) + " operand pair " + std::to_string(index++));
    }
  }
}

TEST(MatmulGpu, BatchedWithBroadcastBatchDims) {
  PRECIS_SKIP_WITHOUT_GPU();
  struct Batched {
    Shape a, b;
    bool transpose_b;
  };
  const Batched cases[] = {
      {{4, 7, 5}, {4, 5, 6}, false},        // one strided batch
      {{2, 3, 4, 5}, {3, 5, 6}, false},     // b repeats along the first dim: a loop around a strided batch
      {{2, 3, 7, 5}, {5, 6}, false},        // one b for all: folded into a [42, 5] x [5, 6] product
      {{1, 7, 5}, {4, 5, 6}, false},        // a broadcast: batch stride 0
      {{3, 1, 7, 5}, {1, 4, 5, 6}, false},  // both broadcast
      {{4, 7, 5}, {4, 6, 5}, true},         // transposed b in a batch
      {{2, 3, 7, 5}, {6, 5}, true},         // one transposed b for all
  };
  for (DType dtype : {DType::f32, DType::bf16}) {
    const double tol = dtype == DType::f32 ? 1e-5 : 1e-2;
    for (const Batched& c : cases) {
      Tensor a = host_values(c.a, 7, dtype), b = host_values(c.b, 8, dtype);
      Tensor ga = a.to(kGpu), gb = b.to(kGpu);
      if (c.transpose_b) {
        b = b.transpose(-1, -2);
        gb = gb.transpose(-1, -2);
      }
      Tensor expected = ops::matmul(f64(a), f64(b.contiguous()));
      Tensor out = poisoned(expected.shape(), dtype);
      ops::cuda::matmul(out, ga, gb);
      std::string what = std::string(dtype_name(dtype)) + " " + detail::concat(c.a) + " x " + detail::concat(c.b) +
                         (c.transpose_b ? " (b transposed)" : "");
      expect_near_magnitude(out, expected, tol, what);
      poison_next_allocation(expected.shape(), dtype);
      expect_near_magnitude(ops::matmul(ga, gb), expected, tol, what + " through ops::matmul");
    }
    // numpy's rules for 1-D operands.
    Tensor v = host_values({5}, 9, dtype), m = host_values({3, 5, 4}, 10, dtype);
    expect_near_magnitude(ops::matmul(v.to(kGpu), m.to(kGpu)), ops::matmul(f64(v), f64(m)), tol, "vector @ batch");
    Tensor w = host_values({4}, 11, dtype);
    expect_near_magnitude(ops::matmul(m.to(kGpu), w.to(kGpu)), ops::matmul(f64(m), f64(w)), tol, "batch @ vector");
  }
}

TEST(MatmulGpu, LinearEpiloguesMatchCpuCompositions) {
  PRECIS_SKIP_WITHOUT_GPU();
  for (bool fuse : {true, false}) {
    ops::cuda::set_fuse_epilogues(fuse);
    for (auto [N, in, out] : kSizes) {
      for (const Precision& p : kPrecisions) {
        Tf32Scope tf32(p.tf32);
        const std::string what = std::string(fuse ? "fused " : "unfused ") + p.name + " linear [" + std::to_string(N) +
                                 ", " + std::to_string(in) + "] -> " + std::to_string(out);
        Tensor x = host_values({N, in}, 12, p.dtype), w = host_values({out, in}, 13, p.dtype);
        Tensor b = host_values({out}, 14, p.dtype);
        Tensor gx = x.to(kGpu), gw = w.to(kGpu), gb = b.to(kGpu);
        Tensor xw = ops::linear(f64(x), f64(w)), z = ops::linear(f64(x), f64(w), f64(b));

        Tensor y = poisoned({N, out}, p.dtype);
        ops::cuda::linear(y, gx, gw, Tensor());
        expect_near_magnitude(y, xw, p.tol, what + " without bias");
        y = poisoned({N, out}, p.dtype);
        ops::cuda::linear(y, gx, gw, gb);
        expect_near_magnitude(y, z, p.tol, what + " with the bias epilogue");
        y = poisoned({N, out}, p.dtype);
        ops::cuda::linear(y, gx, gw, gb, /*gelu=*/true);
        expect_near_magnitude(y, ops::gelu(z), p.tol, what + " with bias and GELU");
        y = poisoned({N, out}, p.dtype);
        ops::cuda::linear(y, gx, gw, Tensor(), /*gelu=*/true);
        expect_near_magnitude(y, ops::gelu(xw), p.tol, what + " with GELU, no bias");
        // Saving the GELU input: the aux matrix has rows padded to a multiple of 8, padding poisoned too.
        Tensor pre_rows = poisoned({N, ops::cuda::gelu_aux_ld(out)}, p.dtype);
        Tensor pre = pre_rows.narrow(1, 0, out);
        y = poisoned({N, out}, p.dtype);
        ops::cuda::linear(y, gx, gw, gb, /*gelu=*/true, pre);
        expect_near_magnitude(y, ops::gelu(z), p.tol, what + " with bias and GELU, saving its input");
        Tensor pre_host = f64(pre_rows).narrow(1, 0, out);
        expect_near_magnitude(pre_host, z, p.tol, what + ": the saved GELU input");

        // Parameter gradients: dW = g^T x and db = g summed over rows (BGRADB when fused).
        Tensor g = host_values({N, out}, 15, p.dtype);
        Tensor dw = poisoned({out, in}, p.dtype), db = poisoned({out}, p.dtype);
        ops::cuda::linear_param_backward(dw, db, g.to(kGpu), gx);
        expect_near_magnitude(dw, ops::matmul(f64(g).t(), f64(x)), p.tol, what + ": weight gradient");
        expect_near_magnitude(db, ops::sum(f64(g), {0}), p.tol, what + ": bias gradient");
        dw = poisoned({out, in}, p.dtype);
        ops::cuda::linear_param_backward(dw, Tensor(), g.to(kGpu), gx);
        expect_near_magnitude(dw, ops::matmul(f64(g).t(), f64(x)), p.tol, what + ": weight gradient alone");

        // GELU gradient from the saved (padded) GELU input.
        Tensor z_cpu = pre_host.contiguous();
        z_cpu.set_requires_grad(true);
        ops::gelu(z_cpu).backward(f64(g));
        Tensor grad_pre = poisoned({N, out}, p.dtype);
        ops::cuda::gelu_backward(grad_pre, g.to(kGpu), pre);
        expect_near_magnitude(grad_pre, z_cpu.grad(), p.tol, what + ": GELU gradient");
      }
    }
  }
  ops::cuda::set_fuse_epilogues(true);
}

TEST(MatmulGpu, GeluGradientInTheNextProductMatchesTheCpu) {
  PRECIS_SKIP_WITHOUT_GPU();
  // grad_pre = (g W) * gelu'(pre), g: [N, out], W: [out, hidden], pre: [N, hidden] in rows padded to 8.
  for (bool fuse : {true, false}) {
    ops::cuda::set_fuse_epilogues(fuse);
    for (auto [N, hidden, out] :
         std::vector<std::tuple<int64_t, int64_t, int64_t>>{{1, 1, 1}, {7, 13, 5}, {33, 65, 17}, {1000, 3072, 768}}) {
      for (const Precision& p : kPrecisions) {
        Tf32Scope tf32(p.tf32);
        const std::string what = std::string(fuse ? "fused " : "unfused ") + p.name + " [" + std::to_string(N) + ", " +
                                 std::to_string(out) + "] x [" + std::to_string(out) + ", " + std::to_string(hidden) +
                                 "] through the GELU";
        Tensor g = host_values({N, out}, 26, p.dtype), w = host_values({out, hidden}, 27, p.dtype);
        Tensor z = random_f64({N, hidden}, 28, -3, 3).to(p.dtype);
        Tensor pre_rows = poisoned({N, ops::cuda::gelu_aux_ld(hidden)}, p.dtype);
        Tensor pre = pre_rows.narrow(1, 0, hidden);
        copy_(pre, z.to(kGpu));
        Tensor z64 = f64(z).set_requires_grad();
        ops::gelu(z64).backward(ops::matmul(f64(g), f64(w)));
        Tensor grad_pre = poisoned({N, hidden}, p.dtype);
        ops::cuda::linear_gelu_input_backward(grad_pre, g.to(kGpu), w.to(kGpu), pre);
        expect_near_magnitude(grad_pre, z64.grad(), p.tol, what);
      }
    }
  }
  ops::cuda::set_fuse_epilogues(true);
}

TEST(MatmulGpu, HeuristicIsAskedOncePerProblem) {
  PRECIS_SKIP_WITHOUT_GPU();
  Tensor a = host_values({19, 23}, 16, DType::f32).to(kGpu), b = host_values({23, 29}, 17, DType::f32).to(kGpu);
  Tensor out = empty({19, 29}, DType::f32, kGpu);
  ops::cuda::MatmulCacheStats before = ops::cuda::matmul_cache_stats();
  ops::cuda::matmul(out, a, b);
  ops::cuda::MatmulCacheStats first = ops::cuda::matmul_cache_stats();
  EXPECT_EQ(first.lookups, before.lookups + 1);
  EXPECT_EQ(first.hits, before.hits);
  EXPECT_EQ(first.entries, before.entries + 1);
  ops::cuda::matmul(out, a, b);
  ops::cuda::MatmulCacheStats second = ops::cuda::matmul_cache_stats();
  EXPECT_EQ(second.lookups, first.lookups + 1);
  EXPECT_EQ(second.hits, first.hits + 1);
  EXPECT_EQ(second.entries, first.entries);
  {
    Tf32Scope tf32(true);  // another compute type: another problem
    ops::cuda::matmul(out, a, b);
  }
  ops::cuda::MatmulCacheStats third = ops::cuda::matmul_cache_stats();
  EXPECT_EQ(third.hits, second.hits);
  EXPECT_EQ(third.entries, second.entries + 1);
}
#endif

// Autotuning (on by default) times the heuristic's candidates once for a large problem
// and caches the winner, which still computes the product; switched off, a new problem
// takes the heuristic's first answer untimed.
TEST(MatmulGpu, AutotuneTimesALargeProblemOnceAndItsChoiceMatchesTheCpu) {
  PRECIS_SKIP_WITHOUT_GPU();
  ASSERT_TRUE(ops::matmul_autotune()) << "on by default";
  for (DType dtype : {DType::f16, DType::bf16}) {
    const std::string what = std::string(dtype_name(dtype)) + " [1024, 768] x [768, 3072]";
    Tensor a = host_values({1024, 768}, 40, dtype), b = host_values({768, 3072}, 41, dtype);
    const Tensor expected = ops::matmul(f64(a), f64(b));
    Tensor ga = a.to(kGpu), gb = b.to(kGpu);
    const ops::cuda::MatmulCacheStats before = ops::cuda::matmul_cache_stats();
    Tensor out = poisoned({1024, 3072}, dtype);
    ops::cuda::matmul(out, ga, gb);
    const ops::cuda::MatmulCacheStats tuned = ops::cuda::matmul_cache_stats();
    EXPECT_EQ(tuned.autotuned, before.autotuned + 1) << what;
    expect_near_magnitude(out, expected, 1e-2, what + ", first (timed) call");
    out = poisoned({1024, 3072}, dtype);
    ops::cuda::matmul(out, ga, gb);
    const ops::cuda::MatmulCacheStats again = ops::cuda::matmul_cache_stats();
    EXPECT_EQ(again.autotuned, tuned.autotuned) << what << ": timed once";
    EXPECT_EQ(again.hits, tuned.hits + 1) << what;
    expect_near_magnitude(out, expected, 1e-2, what + ", cached choice");
  }
  ops::set_matmul_autotune(false);
  Tensor a = host_values({1024, 768}, 42, DType::f16), b = host_values({768, 2304}, 43, DType::f16);
  const ops::cuda::MatmulCacheStats before = ops::cuda::matmul_cache_stats();
  Tensor out = poisoned({1024, 2304}, DType::f16);
  ops::cuda::matmul(out, a.to(kGpu), b.to(kGpu));
  ops::set_matmul_autotune(true);
  EXPECT_EQ(ops::cuda::matmul_cache_stats().autotuned, before.autotuned) << "autotune off";
  EXPECT_EQ(ops::cuda::matmul_cache_stats().entries, before.entries + 1);
  expect_near_magnitude(out, ops::matmul(f64(a), f64(b)), 1e-2, "float16 product with autotune off");
}

TEST(MatmulGpu, LinearAndLinearGeluForwardAndBackwardMatchTheCpu) {
  PRECIS_SKIP_WITHOUT_GPU();
  struct Case {
    Shape x;
    int64_t out;
    bool bias;
  };
  const Case cases[] = {{{2, 5, 13}, 7, true}, {{13}, 7, true}, {{3, 37, 96}, 65, false}, {{2, 128, 768}, 3072, true}};
  // Which of x, W, b want gradients.
  const std::array<bool, 3> wants[] = {{true, true, true}, {false, true, true}, {true, false, true}};
  for (DType dtype : {DType::f32, DType::f16, DType::bf16}) {
    const double tol = dtype == DType::f32 ? 1e-5 : 1e-2;
    for (bool gelu : {false, true}) {
      const char* op = gelu ? "linear_gelu" : "linear";
      auto apply = [&](const Tensor& x, const Tensor& w, const Tensor& b) {
        return gelu ? ops::linear_gelu(x, w, b) : ops::linear(x, w, b);
      };
      for (const Case& c : cases) {
        for (const auto& want : wants) {
          const int64_t in = c.x.back();
          Tensor x = host_values(c.x, 18, dtype), w = host_values({c.out, in}, 19, dtype);
          Tensor b = c.bias ? host_values({c.out}, 20, dtype) : Tensor();
          Shape y_shape = c.x;
          y_shape.back() = c.out;
          Tensor g = host_values(y_shape, 21, dtype);
          const std::string what = std::string(dtype_name(dtype)) + " " + op + " " + detail::concat(c.x) + " -> " +
                                   std::to_string(c.out) + (c.bias ? "" : " without bias") + " grads " +
                                   std::to_string(want[0]) + std::to_string(want[1]) + std::to_string(want[2]);

          Tensor cx = f64(x).set_requires_grad(want[0]), cw = f64(w).set_requires_grad(want[1]);
          Tensor cb = c.bias ? f64(b).set_requires_grad(want[2]) : Tensor();
          Tensor expected = apply(cx, cw, cb);
          expected.backward(f64(g));

          Tensor gx = x.to(kGpu).set_requires_grad(want[0]), gw = w.to(kGpu).set_requires_grad(want[1]);
          Tensor gb = c.bias ? b.to(kGpu).set_requires_grad(want[2]) : Tensor();
          poison_next_allocation(y_shape, dtype);
          Tensor y = apply(gx, gw, gb);
          ASSERT_TRUE(y.grad_fn()) << what;
          EXPECT_EQ(y.grad_fn()->name(), op) << what;
          // One node: the inputs' accumulators hang directly off it (no reshape or add in between).
          for (const Edge& edge : y.grad_fn()->next_edges()) {
            if (edge.node) {
              EXPECT_EQ(edge.node->name(), "AccumulateGrad") << what;
            }
          }
          EXPECT_EQ(y.dtype(), dtype);
          expect_near_magnitude(y, expected.detach(), tol, what + ": output");
          y.backward(g.to(kGpu));
          if (want[0]) expect_near_magnitude(gx.grad(), cx.grad(), tol, what + ": input gradient");
          if (want[1]) expect_near_magnitude(gw.grad(), cw.grad(), tol, what + ": weight gradient");
          if (c.bias && want[2]) expect_near_magnitude(gb.grad(), cb.grad(), tol, what + ": bias gradient");
          EXPECT_EQ(gx.grad().defined(), want[0]) << what;
          EXPECT_EQ(gw.grad().defined(), want[1]) << what;
        }
      }
    }
  }
}

TEST(MatmulGpu, LinearUnderBf16AutocastMatchesTheCpu) {
  PRECIS_SKIP_WITHOUT_GPU();
  Tensor x = host_values({4, 9, 32}, 22, DType::f32), w = host_values({48, 32}, 23, DType::f32);
  Tensor b = host_values({48}, 24, DType::f32), g = host_values({4, 9, 48}, 25, DType::bf16);
  for (bool gelu : {false, true}) {
    auto run = [&](Device device) {
      Tensor xd = x.to(device), wd = w.detach().to(device), bd = b.detach().to(device);
      wd.set_requires_grad();
      bd.set_requires_grad();
      Tensor y;
      {
        ops::autocast::Scope scope(DType::bf16);
        y = gelu ? ops::linear_gelu(xd, wd, bd) : ops::linear(xd, wd, bd);
        ops::autocast::clear_cache();
      }
      EXPECT_EQ(y.dtype(), DType::bf16);
      y.backward(g.to(device));
      EXPECT_EQ(wd.grad().dtype(), DType::f32);
      return std::vector<Tensor>{y, wd.grad(), bd.grad()};
    };
    std::vector<Tensor> cpu = run(Device::cpu()), gpu = run(kGpu);
    const char* op = gelu ? "autocast linear_gelu" : "autocast linear";
    expect_near_magnitude(gpu[0], f64(cpu[0]), 1e-2, std::string(op) + ": output");
    expect_near_magnitude(gpu[1], f64(cpu[1]), 1e-2, std::string(op) + ": weight gradient");
    expect_near_magnitude(gpu[2], f64(cpu[2]), 1e-2, std::string(op) + ": bias gradient");
  }
}

TEST(MatmulGpu, LinearGeluLinearIsOneNodeAndMatchesTheCpu) {
  PRECIS_SKIP_WITHOUT_GPU();
  struct Case {
    Shape x;
    int64_t hidden, out;
    bool bias;
  };
  const Case cases[] = {
      {{2, 5, 13}, 9, 7, true}, {{13}, 9, 7, false}, {{3, 37, 96}, 65, 33, true}, {{2, 128, 768}, 3072, 768, true}};
  // Which of x, W1, b1, W2, b2 want gradients.
  const std::array<bool, 5> wants[] = {{true, true, true, true, true},
                                       {false, true, true, true, true},
                                       {true, false, false, true, false},
                                       {false, false, false, true, true}};
  for (bool fuse : {true, false}) {
    ops::cuda::set_fuse_epilogues(fuse);
    for (DType dtype : {DType::f32, DType::bf16}) {
      const double tol = dtype == DType::f32 ? 1e-5 : 1e-2;
      for (const Case& c : cases) {
        for (const auto& want : wants) {
          const int64_t in = c.x.back();
          std::vector<Tensor> host = {host_values(c.x, 29, dtype), host_values({c.hidden, in}, 30, dtype),
                                      c.bias ? host_values({c.hidden}, 31, dtype) : Tensor(),
                                      host_values({c.out, c.hidden}, 32, dtype),
                                      c.bias ? host_values({c.out}, 33, dtype) : Tensor()};
          Shape y_shape = c.x;
          y_shape.back() = c.out;
          Tensor g = host_values(y_shape, 34, dtype);
          const std::string what = std::string(fuse ? "fused " : "unfused ") + dtype_name(dtype) + " " +
                                   detail::concat(c.x) + " -> " + std::to_string(c.hidden) + " -> " +
                                   std::to_string(c.out) + (c.bias ? "" : " without biases") + " grads " +
                                   std::to_string(want[0]) + std::to_string(want[1]) + std::to_string(want[3]);
          std::vector<Tensor> cpu(5), gpu(5);
          for (size_t i = 0; i < 5; ++i) {
            if (!host[i].defined()) continue;
            cpu[i] = f64(host[i]).set_requires_grad(want[i]);
            gpu[i] = host[i].to(kGpu).set_requires_grad(want[i]);
          }
          Tensor expected = ops::linear(ops::gelu(ops::linear(cpu[0], cpu[1], cpu[2])), cpu[3], cpu[4]);
          expected.backward(f64(g));
          poison_next_allocation(y_shape, dtype);
          Tensor y = ops::linear_gelu_linear(gpu[0], gpu[1], gpu[2], gpu[3], gpu[4]);
          ASSERT_TRUE(y.grad_fn()) << what;
          EXPECT_EQ(y.grad_fn()->name(), "linear_gelu_linear") << what;
          EXPECT_EQ(y.dtype(), dtype);
          expect_near_magnitude(y, expected.detach(), tol, what + ": output");
          y.backward(g.to(kGpu));
          const char* names[] = {"input", "first weight", "first bias", "second weight", "second bias"};
          for (size_t i = 0; i < 5; ++i) {
            if (!host[i].defined()) continue;
            EXPECT_EQ(gpu[i].grad().defined(), want[i]) << what << ": " << names[i];
            if (want[i]) expect_near_magnitude(gpu[i].grad(), cpu[i].grad(), tol, what + ": " + names[i] + " gradient");
          }
        }
      }
    }
  }
  ops::cuda::set_fuse_epilogues(true);

  // Under bf16 autocast with f32 weights, as a GPT-2 MLP runs: the same as the CPU.
  Tensor x = host_values({4, 9, 32}, 35, DType::f32), w1 = host_values({128, 32}, 36, DType::f32);
  Tensor b1 = host_values({128}, 37, DType::f32), w2 = host_values({32, 128}, 38, DType::f32);
  Tensor g = host_values({4, 9, 32}, 39, DType::bf16);
  auto run = [&](Device device) {
    std::vector<Tensor> leaves;
    for (const Tensor& t : {x, w1, b1, w2}) leaves.push_back(t.to(device).detach().set_requires_grad());
    Tensor y;
    {
      ops::autocast::Scope scope(DType::bf16);
      y = ops::linear_gelu_linear(leaves[0], leaves[1], leaves[2], leaves[3]);
      ops::autocast::clear_cache();
    }
    EXPECT_EQ(y.dtype(), DType::bf16);
    y.backward(g.to(device));
    leaves.push_back(y);
    return leaves;
  };
  std::vector<Tensor> cpu = run(Device::cpu()), gpu = run(kGpu);
  expect_near_magnitude(gpu[4], f64(cpu[4]), 1e-2, "autocast linear_gelu_linear: output");
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(gpu[i].grad().dtype(), DType::f32);
    expect_near_magnitude(gpu[i].grad(), f64(cpu[i].grad()), 2e-2,
                          "autocast linear_gelu_linear: gradient " + std::to_string(i));
  }
}

TEST(MatmulGpu, ErrorsNameTheOpAndTheShapes) {
  PRECIS_SKIP_WITHOUT_GPU();
  try {
    ops::matmul(zeros({2, 3}, DType::f32, kGpu), zeros({4, 5}, DType::f32, kGpu));
    FAIL();
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "matmul: shapes [2, 3] and [4, 5] do not fit (inner dims 3 and 4 differ)");
  }
  try {
    ops::matmul(zeros({2, 3}, DType::f64, kGpu), zeros({3, 5}, DType::f64, kGpu));
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("matmul: no GPU product for float64"), std::string::npos) << e.what();
  }
  try {
    ops::linear(zeros({2, 3}, DType::f32, kGpu), zeros({4, 3}));
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("linear: tensors on different devices"), std::string::npos) << e.what();
  }
#if PRECIS_WITH_CUDA
  try {
    ops::cuda::matmul(empty({2, 4}, DType::f32, kGpu), zeros({2, 3}, DType::f32, kGpu),
                      zeros({3, 5}, DType::f32, kGpu));
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("matmul: shapes [2, 3] x [3, 5] do not fit"), std::string::npos) << e.what();
  }
#endif
}
