// The sm_90a GELU products (ops/cuda/gemm_gelu_sm90.cu, the experiment ops::gemm_gelu_sm90 of
// issue 19), through the launchers that take them (ops/cuda/matmul.h: linear with GELU and
// pre_gelu, linear_gelu_input_backward) with the switch on:
//  - against a float64 CPU reference of the same math on the same bf16 inputs (sampled rows
//    at the large shapes, every row at the small ones): each bf16 result within one bf16 ulp
//    (2^-7 relative; the kernel rounds once from f32) plus a small floor for the f32 sums;
//  - against today's cuBLASLt path (the switch off), every element, within two ulps plus a
//    floor of 1e-3 of the largest value (cuBLASLt's own tanh);
//  - outputs start as NaN, so an element left unwritten fails; a miss names its row and column.
// Each with the kernel's clusters of 1 and of 2 blocks (ops::cuda::set_gemm_gelu_sm90_cluster;
// 2 where M is a multiple of 256), and with both epilogues (ops::cuda::set_gemm_gelu_sm90_tma_store:
// a shared tile stored by the copy engine, or register pairs stored by each thread), which must
// give the same bits; and with every block tile (ops::cuda::set_gemm_gelu_sm90_tile: 128 x 128
// or 128 x 192 a consumer in ping-pong, 128 x 256 shared by both consumers; the wider ones where
// N is a multiple of theirs, with the shared-tile epilogue only), the same bits again. Shapes:
// one tile and one k-block (128 x 128 x 64: a first GPU
// run localises a layout or descriptor mistake there; 256 x 128 x 64 for one cluster), a few
// tiles of two k-blocks (256 x 512 x 128), several tiles per consumer with k-blocks that do not
// divide the ring (8192 x 1024 x 192: the ping-pong turns, stage phases and pre buffers wrap),
// and GPT-2's (16384 x 3072 x 768); for the 128 x 192 and 128 x 256 tiles their own one tile
// (128 x 192 or 256 x 64), one cluster (256 x 192 or 256 x 64) and several tiles a consumer
// with 5 k-blocks over their ring of 3 (16384 x 768 x 320).
// The backward's column sums (the bias gradient, column_sums after the kernel) are checked
// against the float64 sums of the gradient it wrote. A shape the kernel does not serve runs
// cuBLASLt with the switch on. Skipped, with the reason, where no GPU is usable, and where the
// GPU is not compute capability 9.0.
// TimesAtGpt2Shape prints each path's time a call at GPT-2's shape (cudaEvents, best of 20) for
// an A/B on one GPU, asserting only the results of what it timed; scripts/gemm-gelu-ncu.sh
// profiles it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "core/copy.h"
#include "core/gpu.h"
#include "ops/matmul.h"
#include "ops/ops.h"
#include "support/gpu.h"
#include "support/gradcheck.h"
#if PRECIS_WITH_CUDA
#include <cuda_runtime.h>

#include "core/cuda/runtime.h"
#include "ops/cuda/gemm_gelu_sm90.h"
#include "ops/cuda/matmul.h"
#endif

using namespace precis;
using precis::testing::random_f64;

TEST(GemmGeluGpu, TheSwitchIsSetInProcess) {
  const bool was = ops::gemm_gelu_sm90();
  ops::set_gemm_gelu_sm90(true);
  EXPECT_TRUE(ops::gemm_gelu_sm90());
  ops::set_gemm_gelu_sm90(false);
  EXPECT_FALSE(ops::gemm_gelu_sm90());
  ops::set_gemm_gelu_sm90(was);
}

#if PRECIS_WITH_CUDA

namespace {

const Device kGpu = Device::cuda(0);
const double kNaN = std::nan("");

// Sets the experiment's switch, the kernel's cluster size, its epilogue and its block tile's
// columns, for a scope.
class GemmGeluSwitch {
 public:
  explicit GemmGeluSwitch(bool on, int cluster = 2, bool tma_store = true, int tile = 128)
      : was_(ops::gemm_gelu_sm90()),
        cluster_was_(ops::cuda::gemm_gelu_sm90_cluster()),
        tma_store_was_(ops::cuda::gemm_gelu_sm90_tma_store()),
        tile_was_(ops::cuda::gemm_gelu_sm90_tile()) {
    ops::set_gemm_gelu_sm90(on);
    ops::cuda::set_gemm_gelu_sm90_cluster(cluster);
    ops::cuda::set_gemm_gelu_sm90_tma_store(tma_store);
    ops::cuda::set_gemm_gelu_sm90_tile(tile);
  }
  ~GemmGeluSwitch() {
    ops::set_gemm_gelu_sm90(was_);
    ops::cuda::set_gemm_gelu_sm90_cluster(cluster_was_);
    ops::cuda::set_gemm_gelu_sm90_tma_store(tma_store_was_);
    ops::cuda::set_gemm_gelu_sm90_tile(tile_was_);
  }

 private:
  bool was_;
  int cluster_was_;
  bool tma_store_was_;
  int tile_was_;
};

// The kernel's variants at N columns: the 128 x 128 tile with the shared tile stored by the copy
// engine and with the register pairs; where N is a multiple of 192 or 256, the 128 x 192 or
// 128 x 256 tile (shared tile only).
struct Variant {
  int tile;
  bool tma_store;
  std::string name() const { return std::string(tma_store ? "tma" : "reg") + " tile 128x" + std::to_string(tile); }
};
std::vector<Variant> variants_for(int64_t N) {
  std::vector<Variant> variants;
  if (N % 128 == 0) variants = {{128, true}, {128, false}};
  if (N % 192 == 0) variants.push_back({192, true});
  if (N % 256 == 0) variants.push_back({256, true});
  return variants;
}

// The cluster sizes the kernel runs at M rows: 1, and 2 where the 128-row tiles pair up.
std::vector<int> clusters_for(int64_t M) { return M % 256 == 0 ? std::vector<int>{1, 2} : std::vector<int>{1}; }

constexpr double kGeluK = 0.7978845608028654, kGeluC = 0.044715;
double gelu(double z) { return 0.5 * z * (1.0 + std::tanh(kGeluK * (z + kGeluC * z * z * z))); }
double gelu_grad(double z) {
  const double t = std::tanh(kGeluK * (z + kGeluC * z * z * z));
  return 0.5 * (1.0 + t) + 0.5 * z * (1.0 - t * t) * kGeluK * (1.0 + 3.0 * kGeluC * z * z);
}

// One bf16 ulp is at most 2^-7 of the value: a result rounded once from f32 is within half of
// one of the exact value, two such results within one of each other (two allowed). The floor
// (relative to the largest value) covers f32 sums of K products where they cancel; against
// cuBLASLt a larger one, for a GELU whose tanh may be coarser than tanhf where 1 + tanh cancels.
constexpr double kOneUlp = 1.0 / 128, kTwoUlps = 2.0 / 128, kFloor = 3e-5, kCublasLtFloor = 1e-3;

// The rows the float64 reference computes: all of them up to 512, else 256 spread over every
// row tile (the first and last rows included).
std::vector<int64_t> reference_rows(int64_t M) {
  std::vector<int64_t> rows;
  if (M <= 512) {
    for (int64_t r = 0; r < M; ++r) rows.push_back(r);
    return rows;
  }
  for (int64_t i = 0; i < 256; ++i) rows.push_back(i * M / 256 + (i * 37) % (M / 256));
  rows.back() = M - 1;
  return rows;
}

// got[row, col] (a [*, cols] matrix) against want[i, col] for row = rows[i]:
// |got - want| <= rtol |want| + floor max|want|, and finite. Reports the first 5 misses by row
// and column, and the count.
template <typename Want>
void expect_rows_close(const std::vector<float>& got, const std::vector<Want>& want, const std::vector<int64_t>& rows,
                       int64_t cols, double rtol, const std::string& what, double floor = kFloor) {
  double scale = 0;
  for (double v : want) scale = std::max(scale, std::abs(v));
  int64_t misses = 0;
  double worst = 0;
  for (size_t i = 0; i < rows.size(); ++i)
    for (int64_t c = 0; c < cols; ++c) {
      const double g = got[rows[i] * cols + c], w = want[i * cols + c], err = std::abs(g - w);
      if (std::isfinite(err)) worst = std::max(worst, err / (std::abs(w) + floor * scale));
      if (!(err <= rtol * std::abs(w) + floor * scale)) {
        if (misses < 5) ADD_FAILURE() << what << ": [" << rows[i] << ", " << c << "] is " << g << ", expected " << w;
        ++misses;
      }
    }
  EXPECT_EQ(misses, 0) << what << ": elements outside " << rtol << " relative + " << floor << " x " << scale
                       << "; worst error / (|expected| + floor) " << worst;
}

// Every element of got against cuBLASLt's want (both [rows, cols]).
void expect_all_close(const std::vector<float>& got, const std::vector<float>& want, int64_t cols, double rtol,
                      const std::string& what) {
  std::vector<int64_t> rows(want.size() / cols);
  for (size_t r = 0; r < rows.size(); ++r) rows[r] = static_cast<int64_t>(r);
  expect_rows_close(got, want, rows, cols, rtol, what, kCublasLtFloor);
}

// The forward's operands: x [M, K], W [N, K], bias [N], bf16 on the GPU. pre x W^T + b has a
// standard deviation of ~0.7, so the GELU sees its curved part.
struct Forward {
  int64_t M, N, K;
  Tensor x, w, bias;
};
Forward forward_problem(int64_t M, int64_t N, int64_t K, uint64_t seed) {
  const double a = 2.0 / std::sqrt(static_cast<double>(K));
  return {M,
          N,
          K,
          random_f64({M, K}, seed, -1, 1).to(DType::bf16).to(kGpu),
          random_f64({N, K}, seed + 1, -a, a).to(DType::bf16).to(kGpu),
          random_f64({N}, seed + 2, -0.5, 0.5).to(DType::bf16).to(kGpu)};
}

struct ForwardResult {
  std::vector<float> out, pre;
};
// linear(out, x, W, bias, gelu, pre) with the switch (and cluster size) as given; pre a view with
// row stride N + 64.
ForwardResult run_forward(const Forward& p, bool kernel, int cluster = 1, bool tma_store = true, int tile = 128) {
  GemmGeluSwitch on(kernel, cluster, tma_store, tile);
  Tensor out = full({p.M, p.N}, kNaN, DType::bf16, kGpu);
  Tensor pre = full({p.M, p.N + 64}, kNaN, DType::bf16, kGpu).narrow(1, 0, p.N);
  EXPECT_EQ(ops::cuda::linear_gelu_sm90_supported(out, p.x, p.w, p.bias, pre), true)
      << "the kernel must serve [" << p.M << ", " << p.K << "] x [" << p.N << ", " << p.K << "]^T";
  ops::cuda::linear(out, p.x, p.w, p.bias, true, pre);
  return {out.to_vector<float>(), pre.to_vector<float>()};
}

void check_forward(int64_t M, int64_t N, int64_t K, uint64_t seed) {
  const Forward p = forward_problem(M, N, K, seed);
  const std::vector<int64_t> rows = reference_rows(M);
  std::vector<double> want_pre(rows.size() * N), want_out(rows.size() * N);
  {
    const std::vector<double> x = p.x.to_vector<double>(), w = p.w.to_vector<double>(), b = p.bias.to_vector<double>();
    for (size_t i = 0; i < rows.size(); ++i)
      for (int64_t n = 0; n < N; ++n) {
        double z = b[n];
        for (int64_t k = 0; k < K; ++k) z += x[rows[i] * K + k] * w[n * K + k];
        want_pre[i * N + n] = z;
        want_out[i * N + n] = gelu(z);
      }
  }
  const ForwardResult cublaslt = run_forward(p, false);
  for (int cluster : clusters_for(M)) {
    std::vector<ForwardResult> by_variant;
    const std::vector<Variant> variants = variants_for(N);
    for (const Variant& v : variants) {
      SCOPED_TRACE("clusters of " + std::to_string(cluster) + ", epilogue " + v.name());
      const ForwardResult mine = run_forward(p, true, cluster, v.tma_store, v.tile);
      expect_rows_close(mine.pre, want_pre, rows, N, kOneUlp, "pre against float64");
      expect_rows_close(mine.out, want_out, rows, N, kOneUlp, "gelu(pre) against float64");
      expect_all_close(mine.pre, cublaslt.pre, N, kTwoUlps, "pre against cuBLASLt");
      expect_all_close(mine.out, cublaslt.out, N, kTwoUlps, "gelu(pre) against cuBLASLt");
      by_variant.push_back(mine);
    }
    for (size_t i = 1; i < variants.size(); ++i)
      EXPECT_TRUE(by_variant[0].pre == by_variant[i].pre && by_variant[0].out == by_variant[i].out)
          << variants[0].name() << " and " << variants[i].name() << " differ, clusters of " << cluster;
  }
}

// The backward's operands: grad_out [M, K], W2 [K, N] (the projection's weight), pre [M, N]
// with row stride N + 64, bf16 on the GPU.
struct Backward {
  int64_t M, N, K;
  Tensor grad_out, w, pre;
};
Backward backward_problem(int64_t M, int64_t N, int64_t K, uint64_t seed) {
  const double a = 2.0 / std::sqrt(static_cast<double>(K));
  Tensor pre = full({M, N + 64}, 0.0, DType::bf16, kGpu).narrow(1, 0, N);
  copy_(pre, random_f64({M, N}, seed + 2, -4, 4).to(DType::bf16).to(kGpu));
  return {M,
          N,
          K,
          random_f64({M, K}, seed, -1, 1).to(DType::bf16).to(kGpu),
          random_f64({K, N}, seed + 1, -a, a).to(DType::bf16).to(kGpu),
          pre};
}

struct BackwardResult {
  std::vector<float> grad_pre, sums;
};
// linear_gelu_input_backward with f32 column sums, the switch (and cluster size) as given.
BackwardResult run_backward(const Backward& p, bool kernel, int cluster = 1, bool tma_store = true, int tile = 128) {
  GemmGeluSwitch on(kernel, cluster, tma_store, tile);
  Tensor grad_pre = full({p.M, p.N}, kNaN, DType::bf16, kGpu);
  Tensor sums = full({p.N}, kNaN, DType::f32, kGpu);
  EXPECT_EQ(ops::cuda::linear_gelu_input_backward_sm90_supported(grad_pre, p.grad_out, p.w, p.pre), true)
      << "the kernel must serve [" << p.M << ", " << p.K << "] x [" << p.K << ", " << p.N << "]";
  ops::cuda::linear_gelu_input_backward(grad_pre, p.grad_out, p.w, p.pre, sums, false);
  return {grad_pre.to_vector<float>(), sums.to_vector<float>()};
}

void check_backward(int64_t M, int64_t N, int64_t K, uint64_t seed) {
  const Backward p = backward_problem(M, N, K, seed);
  const std::vector<int64_t> rows = reference_rows(M);
  std::vector<double> want(rows.size() * N, 0.0);
  {
    const std::vector<double> g = p.grad_out.to_vector<double>(), w = p.w.to_vector<double>(),
                              pre = p.pre.to_vector<double>();
    for (size_t i = 0; i < rows.size(); ++i) {
      double* row = want.data() + i * N;
      for (int64_t k = 0; k < K; ++k) {
        const double gk = g[rows[i] * K + k];
        for (int64_t n = 0; n < N; ++n) row[n] += gk * w[k * N + n];
      }
      for (int64_t n = 0; n < N; ++n) row[n] *= gelu_grad(pre[rows[i] * N + n]);
    }
  }
  const BackwardResult cublaslt = run_backward(p, false);
  for (int cluster : clusters_for(M)) {
    std::vector<std::vector<float>> by_variant;
    const std::vector<Variant> variants = variants_for(N);
    for (const Variant& v : variants) {
      SCOPED_TRACE("clusters of " + std::to_string(cluster) + ", epilogue " + v.name());
      const BackwardResult mine = run_backward(p, true, cluster, v.tma_store, v.tile);
      by_variant.push_back(mine.grad_pre);
      expect_rows_close(mine.grad_pre, want, rows, N, kOneUlp, "grad_pre against float64");
      expect_all_close(mine.grad_pre, cublaslt.grad_pre, N, kTwoUlps, "grad_pre against cuBLASLt");
      // the column sums of the gradient the kernel wrote, in float64
      std::vector<double> sums(N, 0.0), magnitude(N, 0.0);
      for (int64_t r = 0; r < M; ++r)
        for (int64_t n = 0; n < N; ++n) {
          sums[n] += mine.grad_pre[r * N + n];
          magnitude[n] += std::abs(mine.grad_pre[r * N + n]);
        }
      int64_t misses = 0;
      for (int64_t n = 0; n < N; ++n)
        if (!(std::abs(mine.sums[n] - sums[n]) <= 1e-5 * magnitude[n] + 1e-6) && misses++ < 5)
          ADD_FAILURE() << "column sum " << n << " is " << mine.sums[n] << ", expected " << sums[n];
      EXPECT_EQ(misses, 0) << "column sums off";
    }
    for (size_t i = 1; i < variants.size(); ++i)
      EXPECT_TRUE(by_variant[0] == by_variant[i])
          << variants[0].name() << " and " << variants[i].name() << " differ, clusters of " << cluster;
  }
}

}  // namespace

TEST(GemmGeluGpu, ServesOnlyItsShapes) {
  PRECIS_SKIP_WITHOUT_GPU();
  const bool hopper = cuda_compute_capability(0) == 90;
  Tensor x = empty({256, 128}, DType::bf16, kGpu), w = empty({512, 128}, DType::bf16, kGpu);
  Tensor b = empty({512}, DType::bf16, kGpu), out = empty({256, 512}, DType::bf16, kGpu);
  Tensor pre = empty({256, 512}, DType::bf16, kGpu);
  EXPECT_EQ(ops::cuda::linear_gelu_sm90_supported(out, x, w, b, pre), hopper);
  EXPECT_EQ(ops::cuda::linear_gelu_sm90_supported(out, x, w, Tensor(), pre), hopper);
  EXPECT_FALSE(ops::cuda::linear_gelu_sm90_supported(out, x, w, b, Tensor()));  // no pre: cuBLASLt
  Tensor x96 = empty({256, 96}, DType::bf16, kGpu), w96 = empty({512, 96}, DType::bf16, kGpu);
  EXPECT_FALSE(ops::cuda::linear_gelu_sm90_supported(out, x96, w96, b, pre));  // K not a multiple of 64
  Tensor x200 = empty({200, 128}, DType::bf16, kGpu), out200 = empty({200, 512}, DType::bf16, kGpu);
  EXPECT_FALSE(ops::cuda::linear_gelu_sm90_supported(out200, x200, w, b, empty({200, 512}, DType::bf16, kGpu)));
  EXPECT_FALSE(ops::cuda::linear_gelu_sm90_supported(out.to(DType::f16), x.to(DType::f16), w.to(DType::f16),
                                                     b.to(DType::f16), pre.to(DType::f16)));
  Tensor g = empty({256, 128}, DType::bf16, kGpu), w2 = empty({128, 512}, DType::bf16, kGpu);
  EXPECT_EQ(ops::cuda::linear_gelu_input_backward_sm90_supported(out, g, w2, pre), hopper);
  EXPECT_FALSE(ops::cuda::linear_gelu_input_backward_sm90_supported(out, g, w2.narrow(1, 0, 384),
                                                                    pre.narrow(1, 0, 384)));  // out [256, 512]
}

// The debug shapes first: one tile and one k-block, then one cluster of two tiles (and the
// same two tiles without a cluster).
TEST(GemmGeluGpu, ForwardOneTileOneKBlock) {
  PRECIS_SKIP_WITHOUT_HOPPER();
  check_forward(128, 128, 64, 100);
}
TEST(GemmGeluGpu, BackwardOneTileOneKBlock) {
  PRECIS_SKIP_WITHOUT_HOPPER();
  check_backward(128, 128, 64, 200);
}
TEST(GemmGeluGpu, ForwardOneClusterOneKBlock) {
  PRECIS_SKIP_WITHOUT_HOPPER();
  check_forward(256, 128, 64, 150);
}
TEST(GemmGeluGpu, BackwardOneClusterOneKBlock) {
  PRECIS_SKIP_WITHOUT_HOPPER();
  check_backward(256, 128, 64, 250);
}
// The wider tiles' debug shapes: one tile and one k-block, one cluster (128 x 192, then
// 128 x 256); then several tiles a consumer with 5 k-blocks over their ring of 3 stages (both,
// and the 128 x 128 tile, run it).
TEST(GemmGeluGpu, Forward192TileOneKBlock) {
  PRECIS_SKIP_WITHOUT_HOPPER();
  check_forward(128, 192, 64, 120);
}
TEST(GemmGeluGpu, Backward192TileOneKBlock) {
  PRECIS_SKIP_WITHOUT_HOPPER();
  check_backward(128, 192, 64, 220);
}
TEST(GemmGeluGpu, Forward192ClusterOneKBlock) {
  PRECIS_SKIP_WITHOUT_HOPPER();
  check_forward(256, 192, 64, 170);
}
TEST(GemmGeluGpu, Backward192ClusterOneKBlock) {
  PRECIS_SKIP_WITHOUT_HOPPER();
  check_backward(256, 192, 64, 270);
}
TEST(GemmGeluGpu, ForwardWideTileOneKBlock) {
  PRECIS_SKIP_WITHOUT_HOPPER();
  check_forward(128, 256, 64, 110);
}
TEST(GemmGeluGpu, BackwardWideTileOneKBlock) {
  PRECIS_SKIP_WITHOUT_HOPPER();
  check_backward(128, 256, 64, 210);
}
TEST(GemmGeluGpu, ForwardWideClusterOneKBlock) {
  PRECIS_SKIP_WITHOUT_HOPPER();
  check_forward(256, 256, 64, 160);
}
TEST(GemmGeluGpu, BackwardWideClusterOneKBlock) {
  PRECIS_SKIP_WITHOUT_HOPPER();
  check_backward(256, 256, 64, 260);
}
TEST(GemmGeluGpu, ForwardWiderTilesFiveKBlocks) {
  PRECIS_SKIP_WITHOUT_HOPPER();
  check_forward(16384, 768, 320, 510);
}
TEST(GemmGeluGpu, BackwardWiderTilesFiveKBlocks) {
  PRECIS_SKIP_WITHOUT_HOPPER();
  check_backward(16384, 768, 320, 610);
}
TEST(GemmGeluGpu, ForwardSmallShape) {
  PRECIS_SKIP_WITHOUT_HOPPER();
  check_forward(256, 512, 128, 300);
}
TEST(GemmGeluGpu, BackwardSmallShape) {
  PRECIS_SKIP_WITHOUT_HOPPER();
  check_backward(256, 512, 128, 400);
}
TEST(GemmGeluGpu, ForwardSeveralTilesPerConsumer) {
  PRECIS_SKIP_WITHOUT_HOPPER();
  check_forward(8192, 1024, 192, 500);
}
TEST(GemmGeluGpu, BackwardSeveralTilesPerConsumer) {
  PRECIS_SKIP_WITHOUT_HOPPER();
  check_backward(8192, 1024, 192, 600);
}
TEST(GemmGeluGpu, ForwardGpt2Shape) {
  PRECIS_SKIP_WITHOUT_HOPPER();
  check_forward(16384, 3072, 768, 700);
}
TEST(GemmGeluGpu, BackwardGpt2Shape) {
  PRECIS_SKIP_WITHOUT_HOPPER();
  check_backward(16384, 768 * 4, 768, 800);
}

// With the switch on, a problem the kernel does not serve (M = 200) runs cuBLASLt: the same bits.
TEST(GemmGeluGpu, OtherShapesKeepCublasLt) {
  PRECIS_SKIP_WITHOUT_GPU();
  Tensor x = random_f64({200, 128}, 900, -1, 1).to(DType::bf16).to(kGpu);
  Tensor w = random_f64({256, 128}, 901, -0.2, 0.2).to(DType::bf16).to(kGpu);
  Tensor b = random_f64({256}, 902, -0.5, 0.5).to(DType::bf16).to(kGpu);
  std::vector<float> results[2];
  for (int on = 0; on < 2; ++on) {
    GemmGeluSwitch s(on == 1);
    Tensor out = full({200, 256}, kNaN, DType::bf16, kGpu), pre = full({200, 256}, kNaN, DType::bf16, kGpu);
    ops::cuda::linear(out, x, w, b, true, pre);
    results[on] = out.to_vector<float>();
  }
  EXPECT_EQ(results[0], results[1]);
}

// Per-call times at GPT-2's shape (M = 16384, N = 3072, K = 768, 77.3 GFLOP), forward (bias,
// pre and gelu written) and backward (grad_pre; no column sums), for cuBLASLt (the switch off)
// and each kernel variant: 3 warm-up calls, then the best of 20 timed one by one with
// cudaEvents on the compute stream. Prints us a call and TFLOP/s; checks each variant's results
// once against cuBLASLt's, asserts nothing about speed. The "no-gelu" rows are a diagnosis
// (ops::cuda::set_gemm_gelu_sm90_timing_without_gelu: the epilogue without gelu/gelu', wrong
// results, unchecked): how much of a tile's time the epilogue's math holds.
TEST(GemmGeluGpu, TimesAtGpt2Shape) {
  PRECIS_SKIP_WITHOUT_HOPPER();
  const int64_t M = 16384, N = 3072, K = 768;
  const double flops = 2.0 * M * N * K;
  const Forward f = forward_problem(M, N, K, 1000);
  const Backward b = backward_problem(M, N, K, 1100);
  struct Timed {
    std::string name;
    bool kernel, tma_store;
    int cluster, tile;
    bool without_gelu = false;  // the diagnosis: no gelu/gelu' in the epilogue, wrong results, not checked
  };
  const std::vector<Timed> variants = {{"cublaslt", false, true, 2, 128},
                                       {"kernel tma cluster2", true, true, 2, 128},
                                       {"kernel tma cluster1", true, true, 1, 128},
                                       {"kernel reg cluster2", true, false, 2, 128},
                                       {"kernel reg cluster1", true, false, 1, 128},
                                       {"kernel 128x192 cl2", true, true, 2, 192},
                                       {"kernel 128x192 cl1", true, true, 1, 192},
                                       {"kernel 128x256 cl2", true, true, 2, 256},
                                       {"kernel 128x256 cl1", true, true, 1, 256},
                                       {"no-gelu 128x128 cl1", true, true, 1, 128, true},
                                       {"no-gelu 128x192 cl2", true, true, 2, 192, true},
                                       {"no-gelu 128x256 cl2", true, true, 2, 256, true}};
  const ForwardResult forward_want = run_forward(f, false);
  const BackwardResult backward_want = run_backward(b, false);
  Tensor out = empty({M, N}, DType::bf16, kGpu), pre = empty({M, N + 64}, DType::bf16, kGpu).narrow(1, 0, N);
  Tensor grad_pre = empty({M, N}, DType::bf16, kGpu);
  const cudaStream_t stream = precis::cuda::compute_stream(kGpu);
  cudaEvent_t start, stop;
  ASSERT_EQ(cudaEventCreate(&start), cudaSuccess);
  ASSERT_EQ(cudaEventCreate(&stop), cudaSuccess);
  auto best_us = [&](const std::function<void()>& call) {
    for (int i = 0; i < 3; ++i) call();
    float best = 1e30f;
    for (int i = 0; i < 20; ++i) {
      EXPECT_EQ(cudaEventRecord(start, stream), cudaSuccess);
      call();
      EXPECT_EQ(cudaEventRecord(stop, stream), cudaSuccess);
      EXPECT_EQ(cudaEventSynchronize(stop), cudaSuccess);
      float ms = 0;
      EXPECT_EQ(cudaEventElapsedTime(&ms, start, stop), cudaSuccess);
      best = std::min(best, ms);
    }
    return 1000.0 * best;
  };
  for (const Timed& v : variants) {
    SCOPED_TRACE(v.name);
    if (v.kernel && !v.without_gelu) {  // what is timed is checked once
      const ForwardResult got = run_forward(f, true, v.cluster, v.tma_store, v.tile);
      expect_all_close(got.pre, forward_want.pre, N, kTwoUlps, "pre against cuBLASLt");
      expect_all_close(got.out, forward_want.out, N, kTwoUlps, "gelu(pre) against cuBLASLt");
      const BackwardResult got_back = run_backward(b, true, v.cluster, v.tma_store, v.tile);
      expect_all_close(got_back.grad_pre, backward_want.grad_pre, N, kTwoUlps, "grad_pre against cuBLASLt");
    }
    GemmGeluSwitch on(v.kernel, v.cluster, v.tma_store, v.tile);
    ops::cuda::set_gemm_gelu_sm90_timing_without_gelu(v.without_gelu);
    const double forward = best_us([&] { ops::cuda::linear(out, f.x, f.w, f.bias, true, pre); });
    const double backward = best_us([&] { ops::cuda::linear_gelu_input_backward(grad_pre, b.grad_out, b.w, b.pre); });
    ops::cuda::set_gemm_gelu_sm90_timing_without_gelu(false);
    std::printf("gemm-gelu %-20s forward %8.1f us %6.1f TFLOP/s   backward %8.1f us %6.1f TFLOP/s\n", v.name.c_str(),
                forward, flops / forward * 1e-6, backward, flops / backward * 1e-6);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
}

#endif  // PRECIS_WITH_CUDA
