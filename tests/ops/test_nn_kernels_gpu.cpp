// GPU softmax / log_softmax, layer norm, cross entropy and embedding against the CPU,
// forward and backward, in f32, f64, f16 and bf16, on odd sizes (rows 1, 7, 513; rows
// of 1, 65, 768, 50257 values), misaligned and strided inputs, ignored and bad targets,
// bad indices, large logits.
//
// The kernels are called directly, with every output filled with NaN first (so an
// element left unwritten fails), and compared with references computed on the CPU in
// f64 from the very values the GPU gets (the CPU ops sum long rows in f32 one value
// after another, which is itself off by ~1e-5 at 50257 values). The ops are then
// called on GPU tensors, with autograd, and compared with the CPU ops.
// Tolerance |gpu - ref| <= rtol |ref| + arel max|ref|: f32 1e-5 and 1e-6, f16/bf16
// 1e-2 and 1e-3, f64 1e-10 and 1e-12. Skipped, with the reason, where no GPU is usable.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "core/copy.h"
#include "ops/ops.h"
#include "support/errors.h"
#include "support/gpu.h"
#include "support/gradcheck.h"
#if PRECIS_WITH_CUDA
#include "ops/cuda/cross_entropy.h"
#include "ops/cuda/embedding.h"
#include "ops/cuda/layer_norm.h"
#include "ops/cuda/softmax.h"
#endif

using namespace precis;
using precis::testing::expect_close;
using precis::testing::expect_error;
using precis::testing::random_f64;

namespace {

const Device kGpu = Device::cuda(0);
const DType kFloatTypes[] = {DType::f32, DType::f64, DType::f16, DType::bf16};

Tensor on_gpu(const Tensor& t) { return t.to(kGpu); }

// Uniform values in [low, high) of `dtype`, on the host.
Tensor values(const Shape& shape, uint64_t seed, DType dtype, double low = -1.0, double high = 1.0) {
  return random_f64(shape, seed, low, high).to(dtype);
}

struct Tolerance {
  double rtol, arel;  // relative to each value, and to the largest one
};
Tolerance tolerance(DType dtype) {
  switch (dtype) {
    case DType::f64:
      return {1e-10, 1e-12};
    case DType::f32:
      return {1e-5, 1e-6};
    default:
      return {1e-2, 1e-3};
  }
}

// `gpu` (a GPU tensor of `dtype`) against `expected` (any tensor of its shape, e.g. an f64 reference).
void expect_near(const Tensor& gpu, const Tensor& expected, DType dtype, Tolerance tol) {
  EXPECT_TRUE(gpu.is_cuda());
  EXPECT_EQ(gpu.dtype(), dtype);
  double largest = 0;
  for (double v : expected.to_vector<double>())
    if (std::isfinite(v)) largest = std::max(largest, std::abs(v));
  expect_close(gpu, expected, tol.arel * largest, tol.rtol);
}
void expect_near(const Tensor& gpu, const Tensor& expected, Tolerance tol) {
  expect_near(gpu, expected, expected.dtype(), tol);
}

// The class of row r: spread over [0, C), with every fifth row ignored (-100).
std::vector<int64_t> class_targets(int64_t rows, int64_t C) {
  std::vector<int64_t> t(rows);
  for (int64_t r = 0; r < rows; ++r) t[r] = r % 5 == 3 ? -100 : (r * 7919 + 3) % C;
  return t;
}

}  // namespace

#if PRECIS_WITH_CUDA

namespace {

const double kNaN = std::numeric_limits<double>::quiet_NaN();

// A GPU tensor full of NaN (-1 for integer dtypes): elements a kernel leaves unwritten fail the comparisons.
Tensor poisoned(const Shape& shape, DType dtype) { return full(shape, is_floating(dtype) ? kNaN : -1.0, dtype, kGpu); }

// Runs fn once on each kernel of the fused classifier's long rows: the bulk-copy one (on GPUs
// of compute capability 9.0 and newer), its one-exponential experiment, and the staged one
// (older GPUs), through staged_classifier_forced and set_one_exp_classifier
// (ops/cuda/cross_entropy.h), which are then put back as they were.
template <typename Fn>
void on_each_long_row_kernel(Fn&& fn) {
  std::atomic<bool>& staged = ops::cuda::staged_classifier_forced();
  const bool staged_before = staged.load(), one_exp_before = ops::cuda::one_exp_classifier();
  const struct {
    const char* name;
    bool staged, one_exp;
  } kernels[] = {{"bulk-copy kernel", false, false},
                 {"bulk-copy kernel, one exponential a logit", false, true},
                 {"staged kernel", true, false}};
  for (const auto& kernel : kernels) {
    SCOPED_TRACE(kernel.name);
    staged = kernel.staged;
    ops::cuda::set_one_exp_classifier(kernel.one_exp);
    fn();
  }
  staged = staged_before;
  ops::cuda::set_one_exp_classifier(one_exp_before);
}

// The dtype of the statistics: f32 (f64 for f64).
DType stats_dtype(DType dtype) { return dtype == DType::f64 ? DType::f64 : DType::f32; }

std::string label(DType dtype, int64_t rows, int64_t n) {
  return std::string(dtype_name(dtype)) + " [" + std::to_string(rows) + ", " + std::to_string(n) + "]";
}

// Row indices with repeats: every fourth one the middle row, the others squares mod V.
std::vector<int64_t> embedding_indices(int64_t N, int64_t V) {
  std::vector<int64_t> idx(N);
  for (int64_t n = 0; n < N; ++n) idx[n] = n % 4 == 1 ? V / 2 : (n * n * 31 + 7) % V;
  return idx;
}

// ---- references in f64, on rows of n values

// softmax or log_softmax of each row.
std::vector<double> softmax_reference(const std::vector<double>& x, int64_t n, bool log) {
  std::vector<double> y(x.size());
  for (size_t base = 0; base < x.size(); base += n) {
    double m = -INFINITY, s = 0;
    for (int64_t i = 0; i < n; ++i) m = std::max(m, x[base + i]);
    for (int64_t i = 0; i < n; ++i) s += std::exp(x[base + i] - m);
    for (int64_t i = 0; i < n; ++i) y[base + i] = log ? x[base + i] - m - std::log(s) : std::exp(x[base + i] - m) / s;
  }
  return y;
}

// dx from the output y and its gradient g.
std::vector<double> softmax_backward_reference(const std::vector<double>& y, const std::vector<double>& g, int64_t n,
                                               bool log) {
  std::vector<double> dx(y.size());
  for (size_t base = 0; base < y.size(); base += n) {
    double acc = 0;
    for (int64_t i = 0; i < n; ++i) acc += log ? g[base + i] : g[base + i] * y[base + i];
    for (int64_t i = 0; i < n; ++i)
      dx[base + i] = log ? g[base + i] - std::exp(y[base + i]) * acc : y[base + i] * (g[base + i] - acc);
  }
  return dx;
}

// Layer norm of rows of C values: y, mean, rstd, and from g: dx, dw, db.
struct LayerNormReference {
  std::vector<double> y, mean, rstd, dx, dw, db;
};
LayerNormReference layer_norm_reference(const std::vector<double>& x, const std::vector<double>& w,
                                        const std::vector<double>& b, const std::vector<double>& g, int64_t C,
                                        double eps) {
  const int64_t rows = static_cast<int64_t>(x.size()) / C;
  LayerNormReference r{std::vector<double>(x.size()), std::vector<double>(rows),   std::vector<double>(rows),
                       std::vector<double>(x.size()), std::vector<double>(C, 0.0), std::vector<double>(C, 0.0)};
  for (int64_t row = 0; row < rows; ++row) {
    const double* xr = x.data() + row * C;
    const double* gr = g.data() + row * C;
    double sum = 0, squares = 0, sum_dxhat = 0, sum_dxhat_xhat = 0;
    for (int64_t j = 0; j < C; ++j) sum += xr[j];
    const double mean = sum / C;
    for (int64_t j = 0; j < C; ++j) squares += (xr[j] - mean) * (xr[j] - mean);
    const double rstd = 1 / std::sqrt(squares / C + eps);
    r.mean[row] = mean;
    r.rstd[row] = rstd;
    for (int64_t j = 0; j < C; ++j) {
      const double xhat = (xr[j] - mean) * rstd;
      r.y[row * C + j] = xhat * w[j] + b[j];
      sum_dxhat += gr[j] * w[j];
      sum_dxhat_xhat += gr[j] * w[j] * xhat;
      r.dw[j] += gr[j] * xhat;
      r.db[j] += gr[j];
    }
    for (int64_t j = 0; j < C; ++j) {
      const double xhat = (xr[j] - mean) * rstd;
      r.dx[row * C + j] = rstd * (gr[j] * w[j] - sum_dxhat / C - xhat * sum_dxhat_xhat / C);
    }
  }
  return r;
}

// Cross entropy of rows of C logits: stats (max, log-sum; zeros where ignored), the mean
// loss, and dlogits for an upstream gradient.
struct CrossEntropyReference {
  std::vector<double> stats, dlogits;
  double loss = 0;
  int64_t n_valid = 0;
};
CrossEntropyReference cross_entropy_reference(const std::vector<double>& x, const std::vector<int64_t>& t, int64_t C,
                                              double upstream) {
  const int64_t rows = static_cast<int64_t>(t.size());
  CrossEntropyReference r{std::vector<double>(2 * rows, 0.0), std::vector<double>(x.size(), 0.0), 0.0, 0};
  double total = 0;
  for (int64_t row = 0; row < rows; ++row) {
    if (t[row] == -100) continue;
    const double* xr = x.data() + row * C;
    double m = -INFINITY, s = 0;
    for (int64_t j = 0; j < C; ++j) m = std::max(m, xr[j]);
    for (int64_t j = 0; j < C; ++j) s += std::exp(xr[j] - m);
    r.stats[2 * row] = m;
    r.stats[2 * row + 1] = std::log(s);
    total += m + std::log(s) - xr[t[row]];
    ++r.n_valid;
  }
  r.loss = total / static_cast<double>(r.n_valid);
  for (int64_t row = 0; row < rows; ++row) {
    if (t[row] == -100) continue;
    for (int64_t j = 0; j < C; ++j) {
      const double p = std::exp(x[row * C + j] - r.stats[2 * row] - r.stats[2 * row + 1]);
      r.dlogits[row * C + j] = upstream * (p - (j == t[row] ? 1.0 : 0.0)) / static_cast<double>(r.n_valid);
    }
  }
  return r;
}

// dweight [V, C] = the rows of g [N, C] added up by index.
std::vector<double> embedding_backward_reference(const std::vector<double>& g, const std::vector<int64_t>& idx,
                                                 int64_t V, int64_t C) {
  std::vector<double> dw(V * C, 0.0);
  for (size_t n = 0; n < idx.size(); ++n)
    for (int64_t c = 0; c < C; ++c) dw[idx[n] * C + c] += g[n * C + c];
  return dw;
}

}  // namespace

// ---------------------------------------------------------------- softmax kernels

TEST(NnKernelsGpu, SoftmaxKernelsMatchTheCpu) {
  PRECIS_SKIP_WITHOUT_GPU();
  const std::vector<std::pair<int64_t, int64_t>> sizes = {{1, 1},    {7, 1},     {513, 7},   {1, 65},
                                                          {7, 65},   {513, 65},  {7, 768},   {513, 768},
                                                          {3, 1025}, {2, 16385}, {1, 50257}, {7, 50257}};
  uint64_t seed = 100;
  for (DType dtype : kFloatTypes) {
    for (auto [rows, n] : sizes) {
      for (bool log : {false, true}) {
        SCOPED_TRACE(label(dtype, rows, n) + (log ? " log_softmax" : " softmax"));
        Tensor x = values({rows, n}, ++seed, dtype, -8, 8);
        Tensor g = values({rows, n}, ++seed, dtype);
        Tensor y = poisoned({rows, n}, dtype);
        ops::cuda::softmax_forward(on_gpu(x), y, log);
        expect_near(y, from_vector(softmax_reference(x.to_vector<double>(), n, log), {rows, n}), dtype,
                    tolerance(dtype));
        // The backward gets the CPU's y (in the dtype), so both sides differentiate the same values.
        Tensor y_in = ops::softmax(x, -1);
        if (log) y_in = ops::log_softmax(x, -1);
        Tensor dx = poisoned({rows, n}, dtype);
        ops::cuda::softmax_backward(on_gpu(y_in), on_gpu(g), dx, log);
        const auto dx_ref = softmax_backward_reference(y_in.to_vector<double>(), g.to_vector<double>(), n, log);
        expect_near(dx, from_vector(dx_ref, {rows, n}), dtype, tolerance(dtype));
      }
    }
  }
}

TEST(NnKernelsGpu, SoftmaxKernelsTakeMisalignedRows) {
  PRECIS_SKIP_WITHOUT_GPU();
  // x and g start one element past a 16-byte boundary, y and dx do not: the element-wise path.
  for (DType dtype : {DType::f32, DType::bf16}) {
    const int64_t rows = 7, n = 130;
    Tensor x = values({rows, n}, 150, dtype, -5, 5), g = values({rows, n}, 151, dtype);
    auto shifted = [&](const Tensor& t) {
      Tensor padded = empty({rows * n + 1}, dtype, kGpu);
      Tensor view = padded.narrow(0, 1, rows * n).view({rows, n});
      copy_(view, on_gpu(t));
      return view;
    };
    for (bool log : {false, true}) {
      Tensor y = poisoned({rows, n}, dtype);
      ops::cuda::softmax_forward(shifted(x), y, log);
      const auto y_ref = softmax_reference(x.to_vector<double>(), n, log);
      expect_near(y, from_vector(y_ref, {rows, n}), dtype, tolerance(dtype));
      Tensor y_in = from_vector(y_ref, {rows, n}).to(dtype);
      Tensor dx = poisoned({rows, n}, dtype);
      ops::cuda::softmax_backward(on_gpu(y_in), shifted(g), dx, log);
      const auto dx_ref = softmax_backward_reference(y_in.to_vector<double>(), g.to_vector<double>(), n, log);
      expect_near(dx, from_vector(dx_ref, {rows, n}), dtype, tolerance(dtype));
    }
  }
}

// ---------------------------------------------------------------- layer norm kernels

TEST(NnKernelsGpu, LayerNormKernelsMatchTheCpu) {
  PRECIS_SKIP_WITHOUT_GPU();
  // {4099, 320}: blocks of the backward take several steps of rows, a few rows at a time, and
  // the f64 forward holds its rows in registers.
  const std::vector<std::pair<int64_t, int64_t>> sizes = {{1, 1},    {7, 1},     {7, 65},     {513, 65},
                                                          {1, 768},  {513, 768}, {4099, 320}, {64, 1600},
                                                          {3, 4099}, {2, 8192},  {2, 16384}};
  uint64_t seed = 200;
  for (DType dtype : kFloatTypes) {
    for (auto [rows, C] : sizes) {
      if (dtype == DType::f64 && C > 8192) continue;  // the f64 backward takes rows of up to 8192 values
      SCOPED_TRACE(label(dtype, rows, C));
      const DType stats = stats_dtype(dtype);
      Tensor x = values({rows, C}, ++seed, dtype, -3, 3), g = values({rows, C}, ++seed, dtype);
      Tensor w = values({C}, ++seed, stats, 0.5, 1.5), b = values({C}, ++seed, stats);
      const LayerNormReference ref = layer_norm_reference(x.to_vector<double>(), w.to_vector<double>(),
                                                          b.to_vector<double>(), g.to_vector<double>(), C, 1e-5);

      Tensor y = poisoned({rows, C}, dtype), mean = poisoned({rows}, stats), rstd = poisoned({rows}, stats);
      Tensor xg = on_gpu(x), wg = on_gpu(w), gg = on_gpu(g);
      ops::cuda::layer_norm_forward(xg, wg, on_gpu(b), 1e-5, y, mean, rstd);
      expect_near(y, from_vector(ref.y, {rows, C}), dtype, tolerance(dtype));
      // The statistics are f32 (f64) whatever the dtype of x; the mean's scale is that of x (3).
      expect_close(mean, from_vector(ref.mean, {rows}), 3 * tolerance(stats).arel, tolerance(stats).rtol);
      expect_near(rstd, from_vector(ref.rstd, {rows}), stats, tolerance(stats));

      Tensor dx = poisoned({rows, C}, dtype), dw = poisoned({C}, stats), db = poisoned({C}, stats);
      ops::cuda::layer_norm_backward(xg, gg, wg, mean, rstd, dx, dw, db);
      expect_near(dx, from_vector(ref.dx, {rows, C}), dtype, tolerance(dtype));
      expect_near(dw, from_vector(ref.dw, {C}), stats, tolerance(stats));
      expect_near(db, from_vector(ref.db, {C}), stats, tolerance(stats));

      // Each output alone: the others skipped, the same bits.
      Tensor dx_only = poisoned({rows, C}, dtype);
      ops::cuda::layer_norm_backward(xg, gg, wg, mean, rstd, dx_only, Tensor(), Tensor());
      expect_close(dx_only, dx, 0, 0);
      Tensor dw_only = poisoned({C}, stats), db_only = poisoned({C}, stats);
      ops::cuda::layer_norm_backward(xg, gg, wg, mean, rstd, Tensor(), dw_only, Tensor());
      ops::cuda::layer_norm_backward(xg, gg, wg, mean, rstd, Tensor(), Tensor(), db_only);
      expect_close(dw_only, dw, 0, 0);
      expect_close(db_only, db, 0, 0);
    }
  }
}

TEST(NnKernelsGpu, LayerNormBackwardOfNoRowsAndTooLongRows) {
  PRECIS_SKIP_WITHOUT_GPU();
  Tensor x = empty({0, 5}, DType::f32, kGpu), g = empty({0, 5}, DType::f32, kGpu);
  Tensor w = on_gpu(values({5}, 250, DType::f32)), stats = empty({0}, DType::f32, kGpu);
  Tensor dw = poisoned({5}, DType::f32), db = poisoned({5}, DType::f32);
  ops::cuda::layer_norm_backward(x, g, w, stats, stats, empty({0, 5}, DType::f32, kGpu), dw, db);
  expect_close(dw, zeros({5}), 0, 0);
  expect_close(db, zeros({5}), 0, 0);

  const int64_t C = 16385;
  Tensor xl = on_gpu(values({2, C}, 251, DType::f32)).set_requires_grad();
  Tensor y = ops::layer_norm(xl, Tensor(), Tensor());
  expect_error(
      [&] {
        y.backward(on_gpu(values({2, C}, 252, DType::f32)));
      },
      "layer_norm backward: rows of 16385 values are longer than the CUDA kernel takes (16384 for float32)");
}

// ---------------------------------------------------------------- cross-entropy kernels

TEST(NnKernelsGpu, CrossEntropyKernelsMatchTheCpu) {
  PRECIS_SKIP_WITHOUT_GPU();
  const std::vector<std::pair<int64_t, int64_t>> sizes = {{1, 1},     {513, 1},   {7, 65},    {513, 65},  {7, 768},
                                                          {513, 768}, {1, 50257}, {7, 50257}, {64, 50257}};
  const double upstream = 1.7;
  uint64_t seed = 300;
  for (DType dtype : kFloatTypes) {
    for (auto [rows, C] : sizes) {
      for (DType target_dtype : {DType::i64, DType::i32}) {
        SCOPED_TRACE(label(dtype, rows, C) + " targets " + dtype_name(target_dtype));
        const DType stats = stats_dtype(dtype);
        Tensor logits = values({rows, C}, ++seed, dtype, -6, 6);
        std::vector<int64_t> t = class_targets(rows, C);
        if (rows == 1) t[0] = C - 1;  // a single row is never ignored
        const CrossEntropyReference ref = cross_entropy_reference(logits.to_vector<double>(), t, C, upstream);

        Tensor lg = on_gpu(logits), tg = on_gpu(from_vector(t, {rows}).to(target_dtype));
        Tensor st = poisoned({rows, 2}, stats), loss = poisoned({}, stats), count = poisoned({}, DType::i64);
        const ops::cuda::BadIndex bad = ops::cuda::cross_entropy_forward(lg, tg, -100, st, loss, count);
        EXPECT_EQ(bad.position, -1);
        // Loss and statistics are f32 (f64) computed from the logits as they are, whatever their dtype.
        EXPECT_EQ(count.item<int64_t>(), ref.n_valid);
        expect_near(loss, scalar_tensor(ref.loss, DType::f64), stats, tolerance(stats));
        expect_near(st, from_vector(ref.stats, {rows, 2}), stats, tolerance(stats));

        Tensor dl = poisoned({rows, C}, dtype);
        ops::cuda::cross_entropy_backward(lg, tg, -100, st, count, on_gpu(scalar_tensor(upstream, stats)), dl);
        expect_near(dl, from_vector(ref.dlogits, {rows, C}), dtype, tolerance(dtype));
      }
    }
  }
}

TEST(NnKernelsGpu, CrossEntropyKernelsTakeMisalignedLogits) {
  PRECIS_SKIP_WITHOUT_GPU();
  // Logits one element past a 16-byte boundary, dlogits aligned: the element-wise backward.
  const int64_t rows = 7, C = 1000;
  Tensor logits = values({rows, C}, 350, DType::bf16, -4, 4);
  Tensor padded = empty({rows * C + 1}, DType::bf16, kGpu);
  Tensor shifted = padded.narrow(0, 1, rows * C).view({rows, C});
  copy_(shifted, on_gpu(logits));
  const std::vector<int64_t> t = class_targets(rows, C);
  const CrossEntropyReference ref = cross_entropy_reference(logits.to_vector<double>(), t, C, 1.0);
  Tensor tg = on_gpu(from_vector(t, {rows}));
  Tensor st = poisoned({rows, 2}, DType::f32), loss = poisoned({}, DType::f32), count = poisoned({}, DType::i64);
  ops::cuda::cross_entropy_forward(shifted, tg, -100, st, loss, count);
  expect_near(loss, scalar_tensor(ref.loss, DType::f64), DType::f32, tolerance(DType::f32));
  Tensor dl = poisoned({rows, C}, DType::bf16);
  ops::cuda::cross_entropy_backward(shifted, tg, -100, st, count, on_gpu(scalar_tensor(1.0)), dl);
  expect_near(dl, from_vector(ref.dlogits, {rows, C}), DType::bf16, tolerance(DType::bf16));
}

TEST(NnKernelsGpu, CrossEntropyKernelsTakeRowStridesAndPaddedGradients) {
  PRECIS_SKIP_WITHOUT_GPU();
  // Rows of C real logits ld apart; dlogits rows `width` apart, zeros past C. The padded
  // classifier's case is ld = width = 50304 for C = 50257.
  struct Case {
    int64_t rows, C, ld, width;
  };
  const std::vector<Case> cases = {{7, 65, 72, 72},        {7, 65, 67, 65},           {513, 1000, 1003, 1000},
                                   {33, 1000, 1024, 1024}, {64, 50257, 50304, 50304}, {3, 50257, 50304, 50257}};
  uint64_t seed = 360;
  for (DType dtype : kFloatTypes) {
    for (const Case& c : cases) {
      SCOPED_TRACE(label(dtype, c.rows, c.C) + " ld " + std::to_string(c.ld) + " width " + std::to_string(c.width));
      const DType stats = stats_dtype(dtype);
      // The columns past C hold huge values: a kernel that read them would be far off.
      Tensor wide = values({c.rows, c.ld}, ++seed, dtype, -6, 6);
      fill_(wide.narrow(1, c.C, c.ld - c.C), 1e4);
      Tensor logits = wide.narrow(1, 0, c.C);
      const std::vector<int64_t> t = class_targets(c.rows, c.C);
      const CrossEntropyReference ref = cross_entropy_reference(logits.contiguous().to_vector<double>(), t, c.C, 0.5);
      Tensor lg = on_gpu(wide).narrow(1, 0, c.C), tg = on_gpu(from_vector(t, {c.rows}));
      Tensor st = poisoned({c.rows, 2}, stats), loss = poisoned({}, stats), count = poisoned({}, DType::i64);
      EXPECT_EQ(ops::cuda::cross_entropy_forward(lg, tg, -100, st, loss, count).position, -1);
      expect_near(loss, scalar_tensor(ref.loss, DType::f64), stats, tolerance(stats));
      expect_near(st, from_vector(ref.stats, {c.rows, 2}), stats, tolerance(stats));

      Tensor dl = poisoned({c.rows, c.width}, dtype);
      ops::cuda::cross_entropy_backward(lg, tg, -100, st, count, on_gpu(scalar_tensor(0.5, stats)), dl);
      expect_near(dl.narrow(1, 0, c.C), from_vector(ref.dlogits, {c.rows, c.C}), dtype, tolerance(dtype));
      expect_close(dl.narrow(1, c.C, c.width - c.C), zeros({c.rows, c.width - c.C}, dtype), 0, 0);
    }
  }
}

TEST(NnKernelsGpu, CrossEntropyWithGradMatchesTheReference) {
  PRECIS_SKIP_WITHOUT_GPU();
  // The fused classifier's one pass: loss and factor * dloss/dlogits against the double
  // reference, padded rows (ld = width >= C) written apart and over the logits, ignored rows,
  // every float dtype (f64 takes the two-pass fallback).
  struct Case {
    int64_t rows, C, width;
  };
  // Rows past 16384 values take a kernel that stages the row in shared memory where it
  // fits (f16/bf16 up to 56320 values, f32 up to 28160; both such kernels, by the A/B switch),
  // the other one where not.
  const std::vector<Case> cases = {{1, 1, 8},           {7, 65, 72},        {513, 1000, 1000}, {33, 1000, 1024},
                                   {7, 768, 768},       {64, 50257, 50304}, {3, 50257, 50264}, {5, 20001, 20008},
                                   {300, 16392, 16392}, {2, 60001, 60008}};
  const double factor = 0.75;
  uint64_t seed = 380;
  on_each_long_row_kernel([&] {
    for (DType dtype : kFloatTypes) {
      for (const Case& c : cases) {
        for (bool overwrite : {false, true}) {
          SCOPED_TRACE(label(dtype, c.rows, c.C) + " width " + std::to_string(c.width) +
                       (overwrite ? " over the logits" : " apart"));
          const DType stats = stats_dtype(dtype);
          Tensor wide = values({c.rows, c.width}, ++seed, dtype, -6, 6);
          fill_(wide.narrow(1, c.C, c.width - c.C), 1e4);  // padding: a kernel that read it would be far off
          std::vector<int64_t> t = class_targets(c.rows, c.C);
          if (c.rows == 1) t[0] = c.C - 1;
          const CrossEntropyReference ref =
              cross_entropy_reference(wide.narrow(1, 0, c.C).contiguous().to_vector<double>(), t, c.C, factor);
          Tensor lg = on_gpu(wide), tg = on_gpu(from_vector(t, {c.rows}));
          Tensor loss = poisoned({}, stats), dl = overwrite ? lg : poisoned({c.rows, c.width}, dtype);
          const ops::cuda::BadIndex bad = ops::cuda::cross_entropy_with_grad(
              lg.narrow(1, 0, c.C), tg, -100, on_gpu(scalar_tensor(factor, stats)), loss, dl);
          EXPECT_EQ(bad.position, -1);
          expect_near(loss, scalar_tensor(ref.loss, DType::f64), stats, tolerance(stats));
          expect_near(dl.narrow(1, 0, c.C), from_vector(ref.dlogits, {c.rows, c.C}), dtype, tolerance(dtype));
          expect_close(dl.narrow(1, c.C, c.width - c.C), zeros({c.rows, c.width - c.C}, dtype), 0, 0);
        }
      }
    }
  });
  // A bad target is reported before anything is written over the logits.
  Tensor lg = on_gpu(values({4, 64}, 399, DType::bf16, -6, 6));
  const Tensor before = lg.clone();
  Tensor loss = poisoned({}, DType::f32);
  const ops::cuda::BadIndex bad =
      ops::cuda::cross_entropy_with_grad(lg, on_gpu(from_vector(std::vector<int64_t>{1, -100, 64, 70}, {4})), -100,
                                         on_gpu(scalar_tensor(1.0, DType::f32)), loss, lg);
  EXPECT_EQ(bad.position, 2);
  EXPECT_EQ(bad.value, 64);
  expect_close(lg, before, 0, 0);
}

TEST(NnKernelsGpu, CrossEntropyWithGradOnGpt2ClassifierRows) {
  PRECIS_SKIP_WITHOUT_GPU();
  // GPT-2's padded classifier (C = 50257 real columns of width 50304) in f16/bf16, the long-row
  // kernels' case: more rows than the GPU holds at once, targets in the first column, at the
  // ends of 16-byte packs, in the last real column (the pack that straddles C) and in the one
  // before it, ignored rows, -inf logits over whole packs; written apart and over the logits.
  const int64_t rows = 300, C = 50257, width = 50304;
  std::vector<int64_t> t = class_targets(rows, C);  // every fifth row ignored
  t[0] = 0;
  t[1] = C - 1;
  t[2] = 4096;
  t[4] = 4095;
  t[5] = C - 2;
  const double factor = 0.5;
  uint64_t seed = 1900;
  on_each_long_row_kernel([&] {
    for (DType dtype : {DType::bf16, DType::f16}) {
      for (bool overwrite : {false, true}) {
        SCOPED_TRACE(label(dtype, rows, C) + (overwrite ? " over the logits" : " apart"));
        Tensor wide = values({rows, width}, ++seed, dtype, -8, 8);
        fill_(wide.narrow(1, C, width - C), 1e4);                   // padding: a kernel that read it would be far off
        fill_(wide.narrow(0, 6, 4).narrow(1, 0, 5000), -INFINITY);  // rows 6-9 target columns past 5000
        const CrossEntropyReference ref =
            cross_entropy_reference(wide.narrow(1, 0, C).contiguous().to_vector<double>(), t, C, factor);
        Tensor lg = on_gpu(wide), tg = on_gpu(from_vector(t, {rows}).to(DType::i32));
        Tensor loss = poisoned({}, DType::f32), dl = overwrite ? lg : poisoned({rows, width}, dtype);
        const ops::cuda::BadIndex bad = ops::cuda::cross_entropy_with_grad(
            lg.narrow(1, 0, C), tg, -100, on_gpu(scalar_tensor(factor, DType::f32)), loss, dl);
        EXPECT_EQ(bad.position, -1);
        expect_near(loss, scalar_tensor(ref.loss, DType::f64), DType::f32, tolerance(DType::f32));
        expect_near(dl.narrow(1, 0, C), from_vector(ref.dlogits, {rows, C}), dtype, tolerance(dtype));
        expect_close(dl.narrow(1, C, width - C), zeros({rows, width - C}, dtype), 0, 0);
      }
    }
  });
}

// ---------------------------------------------------------------- embedding kernels

TEST(NnKernelsGpu, EmbeddingKernelsMatchTheCpu) {
  PRECIS_SKIP_WITHOUT_GPU();
  struct Case {
    int64_t V, C, N;
  };
  const std::vector<Case> cases = {{1, 1, 1},
                                   {50, 65, 7},
                                   {13, 768, 513},
                                   {3, 65, 513},
                                   {1000, 1, 7},
                                   {50257, 64, 513},
                                   {1024, 768, 513},
                                   // more sorted positions than the grid has blocks, a run of ~1000
                                   // equal rows, columns ending inside a tile of the kernel
                                   {50304, 768, 4099},
                                   {7, 1000, 2049}};
  uint64_t seed = 400;
  for (DType dtype : kFloatTypes) {
    for (const Case& c : cases) {
      for (DType index_dtype : {DType::i64, DType::i32}) {
        SCOPED_TRACE(label(dtype, c.V, c.C) + " N " + std::to_string(c.N) + " indices " + dtype_name(index_dtype));
        Tensor weight = values({c.V, c.C}, ++seed, dtype);
        const std::vector<int64_t> idx = embedding_indices(c.N, c.V);
        Tensor indices = from_vector(idx, {c.N}).to(index_dtype);
        Tensor grad = values({c.N, c.C}, ++seed, dtype);

        Tensor ig = on_gpu(indices);
        Tensor out = poisoned({c.N, c.C}, dtype);
        EXPECT_EQ(ops::cuda::embedding_forward(on_gpu(weight), ig, out).position, -1);
        expect_close(out, ops::embedding(weight, indices), 0, 0);  // a gather copies values exactly

        Tensor dw = poisoned({c.V, c.C}, dtype);
        ops::cuda::embedding_backward(on_gpu(grad), ig, dw);
        const auto dw_ref = embedding_backward_reference(grad.to_vector<double>(), idx, c.V, c.C);
        expect_near(dw, from_vector(dw_ref, {c.V, c.C}), dtype, tolerance(dtype));
        // Deterministic: a second run gives the same bits.
        Tensor again = poisoned({c.V, c.C}, dtype);
        ops::cuda::embedding_backward(on_gpu(grad), ig, again);
        expect_close(again, dw, 0, 0);
      }
    }
  }
}

TEST(NnKernelsGpu, EmbeddingForwardReadsStridedWeights) {
  PRECIS_SKIP_WITHOUT_GPU();
  const int64_t V = 37, C = 64, N = 9;
  Tensor indices = from_vector(embedding_indices(N, V), {N});
  for (DType dtype : {DType::f32, DType::bf16}) {
    // Rows 2C apart (16-byte aligned: packed loads), rows C + 3 apart (element by element).
    for (int64_t row_stride : {2 * C, C + 3}) {
      Tensor wide = values({V, row_stride}, 450 + row_stride, dtype);
      Tensor weight = on_gpu(wide).narrow(1, 0, C);
      Tensor out = poisoned({N, C}, dtype);
      EXPECT_EQ(ops::cuda::embedding_forward(weight, on_gpu(indices), out).position, -1);
      expect_close(out, ops::embedding(wide.narrow(1, 0, C), indices), 0, 0);
    }
  }
}

#endif  // PRECIS_WITH_CUDA

// ---------------------------------------------------------------- the ops on GPU tensors, with autograd

TEST(NnKernelsGpu, SoftmaxOpAlongEveryDim) {
  PRECIS_SKIP_WITHOUT_GPU();
  const Shape shape{3, 5, 33};
  for (DType dtype : {DType::f32, DType::f64, DType::bf16}) {
    Tensor x = values(shape, 500, dtype, -4, 4), g = values(shape, 501, dtype);
    for (int64_t dim = -3; dim < 3; ++dim) {
      for (bool log : {false, true}) {
        SCOPED_TRACE(std::string(dtype_name(dtype)) + " dim " + std::to_string(dim) + (log ? " log" : ""));
        Tensor xc = x.detach().set_requires_grad(), xg = on_gpu(x).set_requires_grad();
        Tensor yc = log ? ops::log_softmax(xc, dim) : ops::softmax(xc, dim);
        Tensor yg = log ? ops::log_softmax(xg, dim) : ops::softmax(xg, dim);
        expect_near(yg, yc.detach(), tolerance(dtype));
        EXPECT_TRUE(yg.is_contiguous());
        yc.backward(g);
        yg.backward(on_gpu(g));
        // Each side differentiates its own y; in bf16 the two may be a rounding (2^-8) apart,
        // which exp(y) sum(g) of log_softmax magnifies: a wider tolerance there.
        expect_near(xg.grad(), xc.grad(), dtype == DType::bf16 ? Tolerance{5e-2, 1e-2} : tolerance(dtype));
      }
    }
  }
  // A transposed input, and a 0-dim one.
  Tensor base = values({33, 7}, 502, DType::f32);
  expect_near(ops::softmax(on_gpu(base).t(), 1), ops::softmax(base.t(), 1), tolerance(DType::f32));
  expect_near(ops::softmax(on_gpu(scalar_tensor(3.0)), 0), scalar_tensor(1.0), tolerance(DType::f32));
}

TEST(NnKernelsGpu, SoftmaxOpLargeAndMaskedLogits) {
  PRECIS_SKIP_WITHOUT_GPU();
  const double inf = std::numeric_limits<double>::infinity();
  for (const Tensor& x :
       {tensor({1000, 1001}), tensor({-1000, -1001}), tensor({0, -inf, 0}), tensor({-inf, 5}), tensor({-inf, -inf})}) {
    for (bool log : {false, true}) {
      Tensor yg = log ? ops::log_softmax(on_gpu(x), 0) : ops::softmax(on_gpu(x), 0);
      Tensor yc = log ? ops::log_softmax(x, 0) : ops::softmax(x, 0);
      expect_near(yg, yc, tolerance(DType::f32));  // NaN where the CPU has NaN (a row of -inf)
    }
  }
}

TEST(NnKernelsGpu, LayerNormOpWithAutograd) {
  PRECIS_SKIP_WITHOUT_GPU();
  const Shape shape{2, 7, 65};
  for (DType dtype : {DType::f32, DType::bf16}) {
    for (bool affine : {true, false}) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + (affine ? " affine" : " plain"));
      Tensor x = values(shape, 600, dtype, -2, 2), g = values(shape, 601, dtype);
      Tensor w = affine ? values({65}, 602, dtype, 0.5, 1.5) : Tensor();
      Tensor b = affine ? values({65}, 603, dtype) : Tensor();
      Tensor xc = x.detach().set_requires_grad(), xg = on_gpu(x).set_requires_grad();
      Tensor wc, bc, wg, bg;
      if (affine) {
        wc = w.detach().set_requires_grad();
        bc = b.detach().set_requires_grad();
        wg = on_gpu(w).set_requires_grad();
        bg = on_gpu(b).set_requires_grad();
      }
      Tensor yc = ops::layer_norm(xc, wc, bc), yg = ops::layer_norm(xg, wg, bg);
      expect_near(yg, yc.detach(), tolerance(dtype));
      yc.backward(g);
      yg.backward(on_gpu(g));
      expect_near(xg.grad(), xc.grad(), tolerance(dtype));
      if (affine) {
        expect_near(wg.grad(), wc.grad(), tolerance(dtype));
        expect_near(bg.grad(), bc.grad(), tolerance(dtype));
      }
    }
  }
}

TEST(NnKernelsGpu, CrossEntropyOpWithAutograd) {
  PRECIS_SKIP_WITHOUT_GPU();
  // [2, 3, 65] logits, [2, 3] i32 targets with one ignored, in f32 and bf16.
  for (DType dtype : {DType::f32, DType::bf16}) {
    Tensor logits = values({2, 3, 65}, 700, dtype, -5, 5);
    Tensor targets = from_vector<int64_t>({64, 0, -100, 17, 3, 5}, {2, 3}).to(DType::i32);
    Tensor lc = logits.detach().set_requires_grad(), lg = on_gpu(logits).set_requires_grad();
    Tensor loss_c = ops::cross_entropy(lc, targets), loss_g = ops::cross_entropy(lg, on_gpu(targets));
    EXPECT_EQ(loss_g.dtype(), DType::f32);
    expect_near(loss_g, loss_c.detach(), tolerance(DType::f32));
    loss_c.backward();
    loss_g.backward();
    EXPECT_EQ(lg.grad().dtype(), dtype);
    expect_near(lg.grad(), lc.grad(), tolerance(dtype));
  }
  // A transposed (non-contiguous) view of the logits reads the same values.
  Tensor lt = values({65, 4}, 701, DType::f32, -3, 3);
  Tensor t4 = from_vector<int64_t>({1, 0, 64, 3}, {4});
  expect_near(ops::cross_entropy(on_gpu(lt).t(), on_gpu(t4)), ops::cross_entropy(lt.t(), t4), tolerance(DType::f32));
}

TEST(NnKernelsGpu, PaddedCrossEntropyOpMatchesTheCpu) {
  PRECIS_SKIP_WITHOUT_GPU();
  // [2, 5, 128] logits of which 65 classes are real (the char model's padded vocabulary).
  for (DType dtype : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dtype));
    Tensor logits = values({2, 5, 128}, 720, dtype, -5, 5);
    Tensor targets = from_vector<int64_t>({64, 0, -100, 17, 3, 5, 9, 1, 63, -100}, {2, 5});
    Tensor lc = logits.detach().set_requires_grad(), lg = on_gpu(logits).set_requires_grad();
    Tensor loss_c = ops::cross_entropy(lc, targets, -100, 65);
    Tensor loss_g = ops::cross_entropy(lg, on_gpu(targets), -100, 65);
    expect_near(loss_g, loss_c.detach(), tolerance(DType::f32));
    loss_c.backward();
    loss_g.backward();
    ASSERT_EQ(lg.grad().shape(), Shape({2, 5, 128}));
    expect_near(lg.grad(), lc.grad(), tolerance(dtype));
    expect_close(lg.grad().narrow(2, 65, 63), zeros({2, 5, 63}, dtype), 0, 0);
  }
}

TEST(NnKernelsGpu, CrossEntropyLargeLogitsAndIgnoredTargets) {
  PRECIS_SKIP_WITHOUT_GPU();
  // Logits around 1000: the loss stays finite and matches the CPU.
  Tensor large = random_f64({7, 300}, 800, 995, 1005).to(DType::f32);
  Tensor targets = from_vector(class_targets(7, 300), {7});
  Tensor lc = large.detach().set_requires_grad(), lg = on_gpu(large).set_requires_grad();
  Tensor loss_c = ops::cross_entropy(lc, targets), loss_g = ops::cross_entropy(lg, on_gpu(targets));
  EXPECT_TRUE(std::isfinite(loss_g.item()));
  expect_near(loss_g, loss_c.detach(), tolerance(DType::f32));
  loss_c.backward();
  loss_g.backward();
  expect_near(lg.grad(), lc.grad(), tolerance(DType::f32));

  // Every target ignored: NaN loss (as PyTorch) and zero gradients.
  Tensor all = on_gpu(values({2, 3}, 801, DType::f32)).set_requires_grad();
  Tensor loss = ops::cross_entropy(all, on_gpu(from_vector<int64_t>({-100, -100}, {2})));
  EXPECT_TRUE(std::isnan(loss.item()));
  loss.backward();
  expect_close(all.grad(), zeros({2, 3}), 0, 0);

  // A custom ignore_index: class 1 is ignored, and -100 is then out of range.
  Tensor x = values({3, 4}, 802, DType::f32);
  Tensor t = from_vector<int64_t>({2, 1, 0}, {3});
  expect_near(ops::cross_entropy(on_gpu(x), on_gpu(t), 1), ops::cross_entropy(x, t, 1), tolerance(DType::f32));
  expect_error(
      [&] {
        ops::cross_entropy(on_gpu(x), on_gpu(from_vector<int64_t>({2, -100, 0}, {3})), 1);
      },
      "cross_entropy: target -100 (at flat index 1) is out of range for 4 classes; expected a class in [0, "
      "3] or ignore_index (1)");
}

TEST(NnKernelsGpu, BadTargetsAndIndicesRaiseTheCpuErrors) {
  PRECIS_SKIP_WITHOUT_GPU();
  Tensor logits = on_gpu(zeros({4, 5}));
  // The first bad target by position is reported, for i64 and i32 targets.
  for (DType dtype : {DType::i64, DType::i32}) {
    Tensor targets = on_gpu(from_vector<int64_t>({0, 7, -3, 9}, {4}).to(dtype));
    expect_error([&] { ops::cross_entropy(logits, targets); },
                 "cross_entropy: target 7 (at flat index 1) is out of range for 5 classes; expected a class in [0, "
                 "4] or ignore_index (-100)");
  }
  expect_error(
      [&] {
        ops::cross_entropy(logits, on_gpu(from_vector<int64_t>({0, 1, 2, -1}, {4})));
      },
      "cross_entropy: target -1 (at flat index 3)");
  // The device is still usable after the error.
  EXPECT_NEAR(ops::cross_entropy(logits, on_gpu(from_vector<int64_t>({0, 1, 2, 3}, {4}))).item(), std::log(5.0), 1e-6);

  Tensor weight = on_gpu(values({5, 3}, 900, DType::f32));
  expect_error(
      [&] {
        ops::embedding(weight, on_gpu(from_vector<int64_t>({0, 4, 7, 5}, {4})));
      },
      "embedding: index 7 (at position 2 of the flattened indices) is out of range for a weight of 5 rows "
      "[5, 3]; indices must be in [0, 5)");
  expect_error(
      [&] {
        ops::embedding(weight, on_gpu(from_vector<int64_t>({1, -1}, {2}).to(DType::i32)));
      },
      "embedding: index -1 (at position 1 of the flattened indices)");
}

TEST(NnKernelsGpu, EmbeddingOpWithAutograd) {
  PRECIS_SKIP_WITHOUT_GPU();
  for (DType dtype : {DType::f32, DType::bf16}) {
    Tensor weight = values({11, 24}, 1000, dtype);
    Tensor indices = from_vector<int64_t>({3, 0, 3, 10, 7, 3, 0, 1, 2, 3, 4, 5, 6, 8, 9}, {3, 5});
    Tensor g = values({3, 5, 24}, 1001, dtype);
    Tensor wc = weight.detach().set_requires_grad(), wg = on_gpu(weight).set_requires_grad();
    Tensor oc = ops::embedding(wc, indices), og = ops::embedding(wg, on_gpu(indices));
    EXPECT_EQ(og.shape(), (Shape{3, 5, 24}));
    expect_close(og, oc.detach(), 0, 0);
    oc.backward(g);
    og.backward(on_gpu(g));
    expect_near(wg.grad(), wc.grad(), tolerance(dtype));
  }
  // A transposed weight (column stride != 1) is made dense first.
  Tensor wt = values({24, 11}, 1002, DType::f32);
  Tensor idx = from_vector<int64_t>({10, 0, 5}, {3});
  expect_close(ops::embedding(on_gpu(wt).t(), on_gpu(idx)), ops::embedding(wt.t(), idx), 0, 0);
}
