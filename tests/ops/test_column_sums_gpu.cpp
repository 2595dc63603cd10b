// Column sums on the GPU (ops/cuda/column_sums.cu: linear's bias gradient) against a
// float64 CPU reference, in f32, f16 and bf16: out = 1, N = 1, odd and GPT-2 widths, N
// not a multiple of any chunk; rows at any stride (16-, 8-, 4-, 2-byte and element-wise
// loads, a last pack cut short), transposed, broadcast and empty inputs; the same bits on
// every run; and the bias gradient through linear_param_backward and ops::linear's
// backward, with the epilogue fused or not.
//
// Most inputs are exact: k / 256 with |k| <= kmax and N kmax < 2^24, so every partial
// sum is a multiple of 2^-8 below 2^16 and exact in f32, whatever the order of the
// additions. The GPU result must then equal the exact sum rounded once to the dtype,
// bit for bit (tolerance 0): any element missed, added twice, or accumulated in f16/bf16
// shows up. Outputs start as NaN, so an element left unwritten fails too.
// Skipped, with the reason, where no GPU is usable.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "core/copy.h"
#include "ops/ops.h"
#include "support/gpu.h"
#include "support/gpu_compare.h"
#include "support/gradcheck.h"
#if PRECIS_WITH_CUDA
#include "ops/cuda/column_sums.h"
#include "ops/cuda/matmul.h"
#endif

using namespace precis;
using precis::testing::kCpu;
using precis::testing::kGpu;
using precis::testing::kNaN;
using precis::testing::random_f64;

#if PRECIS_WITH_CUDA

namespace {

const DType kDtypes[] = {DType::f32, DType::f16, DType::bf16};

// [rows, cols] of values k / 256, k a whole number with |k| <= min(255, (2^24 - 1) / rows),
// as f64 on the host: exact in every dtype, and their column sums exact in f32.
Tensor exact_values(const Shape& shape, uint64_t seed) {
  const int64_t rows = shape[0];
  const double kmax =
      static_cast<double>(std::min<int64_t>(255, ((int64_t(1) << 24) - 1) / std::max<int64_t>(rows, 1)));
  std::vector<double> v = random_f64(shape, seed).to_vector<double>();
  for (double& x : v) x = std::round(x * kmax) / 256.0;
  return from_vector(v, shape);
}

std::string label(DType dtype, int64_t rows, int64_t cols) {
  return std::string(dtype_name(dtype)) + " [" + std::to_string(rows) + ", " + std::to_string(cols) + "]";
}

// Bias gradients that cuBLASLt's fused epilogue may have summed, on the GPU, within tol of
// the magnitude of the expected sums (expect_near_magnitude).
void expect_near(const Tensor& actual, const Tensor& expected, double tol, const std::string& what) {
  ASSERT_TRUE(actual.is_cuda()) << what;
  precis::testing::expect_near_magnitude(actual, expected, tol, what);
}

double tolerance(DType dtype) { return dtype == DType::f32 ? 1e-5 : 1e-2; }

// The exact column sums of f64 values, rounded once to `dtype` (host).
Tensor expected_sums(const Tensor& values, DType dtype) { return ops::sum(values, {0}).to(dtype); }

// Every element of the GPU result equals the CPU's (both read as f64), else the first few misses.
void expect_identical(const Tensor& gpu, const Tensor& cpu, const std::string& what) {
  ASSERT_TRUE(gpu.is_cuda()) << what;
  ASSERT_EQ(gpu.shape(), cpu.shape()) << what;
  ASSERT_EQ(gpu.dtype(), cpu.dtype()) << what;
  const std::vector<double> a = gpu.to(kCpu).to_vector<double>(), e = cpu.to_vector<double>();
  int misses = 0;
  for (size_t i = 0; i < a.size() && misses < 5; ++i) {
    if (!(a[i] == e[i])) {
      ADD_FAILURE() << what << ": column " << i << " is " << a[i] << ", expected " << e[i];
      ++misses;
    }
  }
}

// column_sums into a NaN-filled out.
Tensor gpu_column_sums(const Tensor& g) {
  Tensor out = full({g.shape()[1]}, kNaN, g.dtype(), kGpu);
  ops::cuda::column_sums(out, g);
  return out;
}

}  // namespace

TEST(ColumnSumsGpu, MatchTheExactSumsOnOddAndGpt2Shapes) {
  PRECIS_SKIP_WITHOUT_GPU();
  // out = 1, N = 1, odd widths (element-wise loads), widths with a last pack cut short
  // (24 of f32, 100 of bf16), N far from a multiple of any chunk, GPT-2's widths, and
  // tall narrow inputs (many chunks of few columns).
  const std::vector<std::tuple<int64_t, int64_t>> shapes = {
      {1, 1},      {1, 777},    {7, 1},      {1000, 1},    {5, 3},       {33, 8},    {129, 24},  {2049, 100},
      {4099, 769}, {4099, 768}, {517, 3072}, {3000, 2304}, {16384, 768}, {70001, 5}, {300007, 1}};
  uint64_t seed = 100;
  for (auto [rows, cols] : shapes) {
    const Tensor values = exact_values({rows, cols}, seed++);
    for (DType dtype : kDtypes) {
      const Tensor g = values.to(dtype).to(kGpu);
      expect_identical(gpu_column_sums(g), expected_sums(values, dtype), label(dtype, rows, cols));
    }
  }
}

TEST(ColumnSumsGpu, RowsAtAnyStrideOffsetOrLayout) {
  PRECIS_SKIP_WITHOUT_GPU();
  const int64_t rows = 1037, cols = 770;
  // Rows `ld` apart starting `offset` elements into a wider tensor. For bf16/f16 (f32):
  // ld 776, offset 0: 16-byte packs (16-byte), the last cut short (770 = 96 * 8 + 2 = 192 * 4 + 2);
  // offset 4: 8-byte packs (16-byte); ld 772, offset 0: 8-byte (16-byte), the last cut short;
  // ld 774 or 772, offset 2: 4-byte (8-byte); ld 775 or offset 1: element by element.
  const std::vector<std::tuple<int64_t, int64_t>> layouts = {{776, 0}, {776, 4}, {774, 2}, {775, 0},
                                                             {776, 1}, {772, 0}, {772, 2}};
  uint64_t seed = 200;
  for (auto [ld, offset] : layouts) {
    const Tensor wide = exact_values({rows, ld}, seed++);
    const Tensor values = wide.narrow(1, offset, cols);
    for (DType dtype : kDtypes) {
      const Tensor g = wide.to(dtype).to(kGpu).narrow(1, offset, cols);
      ASSERT_EQ(g.strides()[0], ld);
      expect_identical(
          gpu_column_sums(g), expected_sums(values, dtype),
          label(dtype, rows, cols) + " rows " + std::to_string(ld) + " apart from offset " + std::to_string(offset));
    }
  }
  for (DType dtype : kDtypes) {
    // One row, misaligned; columns dense (a transposed view: copied); every row the same (stride 0).
    const Tensor wide = exact_values({1, 40}, 300);
    expect_identical(gpu_column_sums(wide.to(dtype).to(kGpu).narrow(1, 3, 33)),
                     expected_sums(wide.narrow(1, 3, 33), dtype), label(dtype, 1, 33) + " misaligned");
    const Tensor tall = exact_values({cols, rows}, 301);  // g = tall^T: [rows, cols], columns dense
    expect_identical(gpu_column_sums(tall.to(dtype).to(kGpu).t()), expected_sums(tall.t().contiguous(), dtype),
                     label(dtype, rows, cols) + " transposed");
    const Tensor row = exact_values({1, 300}, 302);
    expect_identical(gpu_column_sums(row.to(dtype).to(kGpu).expand({4000, 300})),
                     expected_sums(row.expand({4000, 300}).contiguous(), dtype),
                     label(dtype, 4000, 300) + " broadcast rows");
  }
}

TEST(ColumnSumsGpu, EmptyInputs) {
  PRECIS_SKIP_WITHOUT_GPU();
  for (DType dtype : kDtypes) {
    Tensor out = gpu_column_sums(empty({0, 37}, dtype, kGpu));
    expect_identical(out, zeros({37}, dtype), label(dtype, 0, 37));
    out = empty({0}, dtype, kGpu);
    ops::cuda::column_sums(out, empty({5, 0}, dtype, kGpu));
  }
}

TEST(ColumnSumsGpu, SameBitsOnEveryRun) {
  PRECIS_SKIP_WITHOUT_GPU();
  // Values whose sums do round in f32, so the order of the additions shows.
  for (DType dtype : kDtypes) {
    const Tensor host = random_f64({16384, 768}, 400).to(dtype);
    const Tensor g = host.to(kGpu);
    const Tensor first = gpu_column_sums(g);
    for (int run = 0; run < 3; ++run) {
      expect_identical(gpu_column_sums(g), first.to(kCpu), label(dtype, 16384, 768) + " run " + std::to_string(run));
    }
    // Accumulated in f32: the exact sum's rounding to the dtype, plus 1e-3 (16384 values of |x| < 1 summed in
    // f32 in chunks of a few hundred, then partial sums: errors of ~1e-5; a sum in f16/bf16 would be off by ~0.1-1).
    const std::vector<double> a = first.to(kCpu).to_vector<double>(),
                              e = ops::sum(host.to(DType::f64), {0}).to_vector<double>();
    const double unit = dtype == DType::f32 ? 0x1p-24 : dtype == DType::f16 ? 0x1p-11 : 0x1p-8;
    for (size_t c = 0; c < a.size(); ++c) {
      ASSERT_LE(std::abs(a[c] - e[c]), unit * std::abs(e[c]) + 1e-3) << label(dtype, 16384, 768) << " column " << c;
    }
  }
}

TEST(ColumnSumsGpu, IntoFloat32AndAddedToWhatOutHolds) {
  PRECIS_SKIP_WITHOUT_GPU();
  // A parameter's f32 .grad written or added to where it lies: f32 sums of f16/bf16 rows,
  // unrounded; with accumulate, out + sums added in f32 and rounded once to out's dtype.
  // Exact inputs and held values (k / 256), so every result is exact before that rounding.
  const std::vector<std::tuple<int64_t, int64_t>> shapes = {{5, 3}, {129, 24}, {4099, 769}, {16384, 768}, {517, 3072}};
  uint64_t seed = 450;
  for (auto [rows, cols] : shapes) {
    const Tensor values = exact_values({rows, cols}, seed++);
    const Tensor held = exact_values({1, cols}, seed++).view({cols});
    const Tensor sums = ops::sum(values, {0});
    for (DType dtype : kDtypes) {
      const Tensor g = values.to(dtype).to(kGpu);
      const std::string what = label(dtype, rows, cols);
      Tensor out = full({cols}, kNaN, DType::f32, kGpu);
      ops::cuda::column_sums(out, g);
      expect_identical(out, sums.to(DType::f32), what + " into f32");
      out = held.to(DType::f32).to(kGpu);
      ops::cuda::column_sums(out, g, /*accumulate=*/true);
      expect_identical(out, ops::add(sums, held).to(DType::f32), what + " added into f32");
      out = held.to(dtype).to(kGpu);
      ops::cuda::column_sums(out, g, /*accumulate=*/true);
      expect_identical(out, ops::add(sums, held).to(dtype), what + " added into " + dtype_name(dtype));
    }
  }
  // No rows: added, nothing changes.
  Tensor out = full({7}, 3.0, DType::f32, kGpu);
  ops::cuda::column_sums(out, empty({0, 7}, DType::bf16, kGpu), true);
  expect_identical(out, full({7}, 3.0), "no rows, added");
}

TEST(ColumnSumsGpu, BiasGradientOfLinearParamBackward) {
  PRECIS_SKIP_WITHOUT_GPU();
  // (N, in, out); the last is large enough for autotuning to time fused against split.
  const std::vector<std::tuple<int64_t, int64_t, int64_t>> sizes = {
      {1, 3, 1}, {5, 7, 3}, {300, 5, 8}, {4099, 16, 769}, {2048, 64, 2304}};
  for (bool fuse : {false, true}) {
    ops::cuda::set_fuse_epilogues(fuse);
    uint64_t seed = 500;
    for (auto [N, in, out] : sizes) {
      const Tensor g_values = exact_values({N, out}, seed++);
      const Tensor x_values = random_f64({N, in}, seed++);
      for (DType dtype : kDtypes) {
        const std::string what =
            std::string(fuse ? "fused " : "unfused ") + label(dtype, N, out) + " in " + std::to_string(in);
        const Tensor g = g_values.to(dtype).to(kGpu), x = x_values.to(dtype).to(kGpu);
        Tensor dw = full({out, in}, kNaN, dtype, kGpu), db = full({out}, kNaN, dtype, kGpu);
        ops::cuda::linear_param_backward(dw, db, g, x);
        if (fuse) {
          // cuBLASLt's BGRADB, or our sum where autotuning timed it faster: within the dtype's rounding.
          expect_near(db, ops::sum(g_values, {0}), tolerance(dtype), what + ": bias gradient");
        } else {
          expect_identical(db, expected_sums(g_values, dtype), what + ": bias gradient");
        }
      }
    }
  }
  ops::cuda::set_fuse_epilogues(false);
  for (DType dtype : kDtypes) {
    // grad_out with rows 8 apart (a pack cut short at 6 columns), transposed (copied), and no weight gradient (in = 0).
    const int64_t N = 257, out = 6;
    const Tensor wide = exact_values({N, 8}, 600), x = random_f64({N, 4}, 601).to(dtype).to(kGpu);
    Tensor dw = empty({out, 4}, dtype, kGpu), db = full({out}, kNaN, dtype, kGpu);
    ops::cuda::linear_param_backward(dw, db, wide.to(dtype).to(kGpu).narrow(1, 0, out), x);
    expect_identical(db, expected_sums(wide.narrow(1, 0, out), dtype), label(dtype, N, out) + " strided grad_out");
    const Tensor tall = exact_values({out, N}, 602);
    db = full({out}, kNaN, dtype, kGpu);
    ops::cuda::linear_param_backward(dw, db, tall.to(dtype).to(kGpu).t(), x);
    expect_identical(db, expected_sums(tall.t().contiguous(), dtype), label(dtype, N, out) + " transposed grad_out");
    const Tensor g_values = exact_values({N, out}, 603);
    db = full({out}, kNaN, dtype, kGpu);
    ops::cuda::linear_param_backward(empty({out, 0}, dtype, kGpu), db, g_values.to(dtype).to(kGpu),
                                     empty({N, 0}, dtype, kGpu));
    expect_identical(db, expected_sums(g_values, dtype), label(dtype, N, out) + " with in = 0");
  }
  ops::cuda::set_fuse_epilogues(true);
}

TEST(ColumnSumsGpu, LinearBiasGradientThroughAutogradMatchesTheCpu) {
  PRECIS_SKIP_WITHOUT_GPU();
  // ops::linear's backward (x: [batch..., in] folded to N = 74, 5, 2049 and 1 rows), with the
  // epilogue fused (cuBLASLt's BGRADB or our sum, as autotuning chose) and not (ours).
  const std::vector<std::tuple<Shape, int64_t>> cases = {
      {{2, 37, 3}, 1}, {{5, 11}, 769}, {{3, 683, 16}, 768}, {{1, 9}, 7}};
  for (bool fuse : {true, false}) {
    ops::cuda::set_fuse_epilogues(fuse);
    uint64_t seed = 700;
    for (auto [x_shape, out] : cases) {
      const int64_t in = x_shape.back();
      Shape y_shape = x_shape;
      y_shape.back() = out;
      const int64_t N = shape_numel(y_shape) / out;
      const Tensor x_values = random_f64(x_shape, seed++), w_values = random_f64({out, in}, seed++),
                   b_values = random_f64({out}, seed++);
      const Tensor g_values = exact_values({N, out}, seed++);
      for (DType dtype : kDtypes) {
        const std::string what = std::string(fuse ? "fused " : "unfused ") + label(dtype, N, out) + " linear";
        Tensor x = x_values.to(dtype).to(kGpu), w = w_values.to(dtype).to(kGpu);
        Tensor b = b_values.to(dtype).to(kGpu).set_requires_grad(true);
        Tensor y = ops::linear(x, w, b);
        y.backward(g_values.to(dtype).to(kGpu).view(y_shape));
        ASSERT_TRUE(b.grad().defined()) << what;
        if (fuse) {
          expect_near(b.grad(), ops::sum(g_values, {0}), tolerance(dtype), what + ": bias gradient");
        } else {
          expect_identical(b.grad(), expected_sums(g_values, dtype), what + ": bias gradient");
        }
      }
    }
  }
  ops::cuda::set_fuse_epilogues(true);
}

#else

TEST(ColumnSumsGpu, NeedsACudaBuild) { GTEST_SKIP() << "built without CUDA (PRECIS_CUDA=OFF)"; }

#endif  // PRECIS_WITH_CUDA
