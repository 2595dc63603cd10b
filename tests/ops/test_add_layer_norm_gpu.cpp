// The fused residual add + layer norm on the GPU against the CPU: the kernels called
// directly on poisoned outputs, for every mix of dtypes they take (x, s in T; the residual
// in T or f16/bf16 beside f32; y and its gradient in T, f32 beside f16/bf16, or f16/bf16
// beside f32), on odd sizes and misaligned rows; then the op with autograd against the CPU's
// add + layer_norm, with and without autocast, and layer_norm's out_dtype. References are the CPU ops in f64 on the
// very values the GPU gets (the sum as the GPU rounds it). Skipped, with the reason, where no GPU is usable.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/copy.h"
#include "ops/autocast.h"
#include "ops/ops.h"
#include "support/gpu.h"
#include "support/gpu_compare.h"
#if PRECIS_WITH_CUDA
#include "ops/cuda/layer_norm.h"
#endif

using namespace precis;
using precis::testing::expect_close;
using precis::testing::expect_matches;
using precis::testing::kCpu;
using precis::testing::kGpu;
using precis::testing::random_f64;
using precis::testing::tolerance_for;

namespace {

Tensor values(const Shape& shape, uint64_t seed, DType dtype, double low = -1.0, double high = 1.0) {
  return random_f64(shape, seed, low, high).to(dtype);
}

// `gpu` against a reference, within the tolerance of `tolerance` (a dtype), relative to the
// largest value too; both compared in f64.
void expect_within(const Tensor& gpu, const Tensor& reference, DType tolerance) {
  ASSERT_TRUE(gpu.is_cuda());
  double largest = 0;
  for (double v : reference.to_vector<double>()) largest = std::max(largest, std::abs(v));
  const auto tol = tolerance_for(tolerance);
  expect_close(gpu.to(kCpu).to(DType::f64), reference.to(DType::f64), tol.atol * std::max(1.0, largest), tol.rtol);
}

// `gpu`, in `dtype`, against an f64 reference within the tolerance of `dtype`.
void expect_near(const Tensor& gpu, const Tensor& reference, DType dtype) {
  ASSERT_EQ(gpu.dtype(), dtype);
  expect_within(gpu, reference, dtype);
}

}  // namespace

#if PRECIS_WITH_CUDA

namespace {

Tensor poisoned(const Shape& shape, DType dtype) { return full(shape, precis::testing::kNaN, dtype, kGpu); }

// `t` copied to the GPU into a buffer `offset` elements past its (aligned) start.
Tensor on_gpu_at(const Tensor& t, int64_t offset) {
  Tensor view = empty({t.numel() + offset}, t.dtype(), kGpu).narrow(0, offset, t.numel()).view(t.shape());
  copy_(view, t.to(kGpu));
  return view;
}

struct Dtypes {
  DType x, residual, y;
};

}  // namespace

TEST(AddLayerNormGpu, KernelsMatchTheCpu) {
  PRECIS_SKIP_WITHOUT_GPU();
  const std::vector<Dtypes> mixes = {{DType::f32, DType::f32, DType::f32},   {DType::f32, DType::bf16, DType::f32},
                                     {DType::f32, DType::f16, DType::f32},   {DType::bf16, DType::bf16, DType::bf16},
                                     {DType::bf16, DType::bf16, DType::f32}, {DType::f16, DType::f16, DType::f32},
                                     {DType::f64, DType::f64, DType::f64},   {DType::f32, DType::bf16, DType::bf16},
                                     {DType::f32, DType::f16, DType::f16},   {DType::f32, DType::f32, DType::bf16}};
  const std::vector<std::pair<int64_t, int64_t>> sizes = {{1, 1},     {7, 65},   {513, 768},
                                                          {64, 1600}, {3, 4099}, {2, 16384}};
  uint64_t seed = 1000;
  for (const Dtypes& d : mixes) {
    for (auto [rows, C] : sizes) {
      if (d.x == DType::f64 && C > 8192) continue;  // the f64 backward takes rows of up to 8192 values
      for (bool misaligned : {false, true}) {
        SCOPED_TRACE(std::string(dtype_name(d.x)) + " + " + dtype_name(d.residual) + " -> " + dtype_name(d.y) + " [" +
                     std::to_string(rows) + ", " + std::to_string(C) + "]" + (misaligned ? " misaligned" : ""));
        const DType stats = d.x == DType::f64 ? DType::f64 : DType::f32;
        Tensor x = values({rows, C}, ++seed, d.x, -3, 3), r = values({rows, C}, ++seed, d.residual, -3, 3);
        Tensor w = values({C}, ++seed, stats, 0.5, 1.5), b = values({C}, ++seed, stats);
        Tensor g = values({rows, C}, ++seed, d.y), g_sum = values({rows, C}, ++seed, d.x);
        // Misaligned: x one element past a 16-byte boundary, so every row takes the element-wise path.
        Tensor xg = on_gpu_at(x, misaligned ? 1 : 0), rg = r.to(kGpu);

        // Reference: the sum as the CPU rounds it to x's dtype, normalised in f64.
        const Tensor sum = (x + r).to(d.x);
        Tensor s64 = sum.to(DType::f64).set_requires_grad(), w64 = w.to(DType::f64).set_requires_grad();
        Tensor b64 = b.to(DType::f64).set_requires_grad();
        Tensor y64 = ops::layer_norm(s64, w64, b64);
        y64.backward(g.to(DType::f64));
        const Tensor ds64 = s64.grad() + g_sum.to(DType::f64);

        Tensor sg = poisoned({rows, C}, d.x), y = poisoned({rows, C}, d.y);
        Tensor mean = poisoned({rows}, stats), rstd = poisoned({rows}, stats);
        ops::cuda::layer_norm_forward(xg, w.to(kGpu), b.to(kGpu), 1e-5, y, mean, rstd, rg, sg);
        expect_close(sg, sum, 0, 0);  // the same rounding of the same sum
        expect_near(y, y64.detach(), d.y);

        Tensor ds = poisoned({rows, C}, d.x), dr = poisoned({rows, C}, d.residual);
        Tensor dw = poisoned({C}, stats), db = poisoned({C}, stats);
        ops::cuda::layer_norm_backward(sg, g.to(kGpu), w.to(kGpu), mean, rstd, ds, dw, db, g_sum.to(kGpu), dr);
        expect_near(ds, ds64, d.x);
        expect_near(dr, ds64, d.residual);
        expect_near(dw, w64.grad(), stats);
        expect_near(db, b64.grad(), stats);

        // r's gradient alone (x needs none), and no sum gradient: the norm's dx only.
        Tensor dr_only = poisoned({rows, C}, d.residual);
        ops::cuda::layer_norm_backward(sg, g.to(kGpu), w.to(kGpu), mean, rstd, Tensor(), Tensor(), Tensor(),
                                       g_sum.to(kGpu), dr_only);
        expect_close(dr_only, dr, 0, 0);
        Tensor dx_norm = poisoned({rows, C}, d.x);
        ops::cuda::layer_norm_backward(sg, g.to(kGpu), w.to(kGpu), mean, rstd, dx_norm, Tensor(), Tensor());
        expect_near(dx_norm, s64.grad(), d.x);
      }
    }
  }
}

// With the residual's bias rb (c_proj's, left to the norm): s = x + r + rb, and its gradient,
// the column sums of ds, as a third partial sum of the backward. Rows of 768 take the backward
// that loads ahead (kAhead), 4099 (packs misaligned: element by element) and 8192 the general
// kernel; misaligned x and rb take the forward's element-wise path.
TEST(AddLayerNormGpu, KernelsWithAResidualBiasMatchTheReference) {
  PRECIS_SKIP_WITHOUT_GPU();
  const std::vector<Dtypes> mixes = {{DType::bf16, DType::bf16, DType::bf16}, {DType::f16, DType::f16, DType::f32},
                                     {DType::f32, DType::f32, DType::f32},    {DType::f32, DType::bf16, DType::bf16},
                                     {DType::f64, DType::f64, DType::f64},    {DType::bf16, DType::bf16, DType::f32}};
  const std::vector<std::pair<int64_t, int64_t>> sizes = {{1, 1},    {7, 65},   {513, 768}, {64, 1600},
                                                          {3, 4099}, {2, 8192}, {1030, 768}};
  uint64_t seed = 3000;
  for (const Dtypes& d : mixes) {
    for (auto [rows, C] : sizes) {
      // The parameters 0: in the statistics dtype; for f16/bf16 x also 1: all in x's dtype
      // (bf16-pure's norms), 2: the weight alone in it.
      for (int narrow_params : {0, 1, 2}) {
        for (bool misaligned : {false, true}) {
          const DType stats = d.x == DType::f64 ? DType::f64 : DType::f32;
          if (narrow_params && stats == d.x) continue;
          const DType params = narrow_params == 1 ? d.x : stats, weight_dtype = narrow_params ? d.x : stats;
          SCOPED_TRACE(std::string(dtype_name(d.x)) + " + " + dtype_name(d.residual) + " -> " + dtype_name(d.y) + " [" +
                       std::to_string(rows) + ", " + std::to_string(C) + "]" + (misaligned ? " misaligned" : "") +
                       ", weight in " + dtype_name(weight_dtype) + ", biases in " + dtype_name(params));
          Tensor x = values({rows, C}, ++seed, d.x, -3, 3), r = values({rows, C}, ++seed, d.residual, -3, 3);
          Tensor w = values({C}, ++seed, weight_dtype, 0.5, 1.5), b = values({C}, ++seed, params);
          Tensor rb = values({C}, ++seed, params, -2, 2);
          Tensor g = values({rows, C}, ++seed, d.y), g_sum = values({rows, C}, ++seed, d.x);
          Tensor xg = on_gpu_at(x, misaligned ? 1 : 0), rg = r.to(kGpu), rbg = on_gpu_at(rb, misaligned ? 1 : 0);

          Tensor sg = poisoned({rows, C}, d.x), y = poisoned({rows, C}, d.y);
          Tensor mean = poisoned({rows}, stats), rstd = poisoned({rows}, stats);
          ops::cuda::layer_norm_forward(xg, w.to(kGpu), b.to(kGpu), 1e-5, y, mean, rstd, rg, sg, rbg);
          // The sum, rounded once to x's dtype (the f32 sum of f32 x may round twice: its tolerance).
          const Tensor sum64 = x.to(DType::f64) + r.to(DType::f64) + rb.to(DType::f64);
          expect_near(sg, sum64.to(d.x).to(DType::f64), d.x);

          // Reference: the norm in f64 of the very sum the GPU wrote.
          Tensor s64 = sg.to(DType::f64).to(kCpu).detach().set_requires_grad();
          Tensor w64 = w.to(DType::f64).set_requires_grad(), b64 = b.to(DType::f64).set_requires_grad();
          Tensor y64 = ops::layer_norm(s64, w64, b64);
          y64.backward(g.to(DType::f64));
          const Tensor ds64 = s64.grad() + g_sum.to(DType::f64);
          const Tensor drb64 = ops::sum_to_shape(ds64, Shape{C});
          expect_near(y, y64.detach(), d.y);

          Tensor ds = poisoned({rows, C}, d.x), dr = poisoned({rows, C}, d.residual);
          Tensor dw = poisoned({C}, stats), db = poisoned({C}, stats), drb = poisoned({C}, stats);
          ops::cuda::layer_norm_backward(sg, g.to(kGpu), w.to(kGpu), mean, rstd, ds, dw, db, g_sum.to(kGpu), dr, false,
                                         false, drb, false);
          expect_near(ds, ds64, d.x);
          expect_near(dr, ds64, d.residual);
          expect_near(dw, w64.grad(), stats);
          expect_near(db, b64.grad(), stats);
          expect_near(drb, drb64, stats);

          // The bias's gradient alone (no dx, dr, dw, db); accumulated, added once.
          Tensor drb_only = poisoned({C}, stats);
          ops::cuda::layer_norm_backward(sg, g.to(kGpu), w.to(kGpu), mean, rstd, Tensor(), Tensor(), Tensor(),
                                         g_sum.to(kGpu), Tensor(), false, false, drb_only, false);
          expect_near(drb_only, drb64, stats);
          Tensor drb_added = full({C}, 0.5, stats, kGpu);
          ops::cuda::layer_norm_backward(sg, g.to(kGpu), w.to(kGpu), mean, rstd, ds, dw, db, g_sum.to(kGpu), Tensor(),
                                         false, false, drb_added, true);
          expect_near(drb_added, ops::add(drb64, 0.5), stats);
          // Without g_sum (the sum's own gradient): the norm's dx summed.
          Tensor drb_norm = poisoned({C}, stats);
          ops::cuda::layer_norm_backward(sg, g.to(kGpu), w.to(kGpu), mean, rstd, Tensor(), Tensor(), Tensor(), Tensor(),
                                         Tensor(), false, false, drb_norm, false);
          expect_near(drb_norm, ops::sum_to_shape(s64.grad(), Shape{C}), stats);
        }
      }
    }
  }
}

// The warp-per-row backward (rows of up to 768 values in 16-byte packs): GPT-2's rows (16384 of
// 768), odd row counts, fewer rows than the grid has warps (1, 5), rows of 8 to 768 values (each
// lane size, lanes without a pack of the row); with and without the sum's gradient and the
// residual's bias; the parameter sums in the statistics dtype or in x's dtype (a 16-bit .grad,
// rounded once), written or added. Against the CPU in f64 on the sum the GPU wrote, and the same
// bits from a second run (the sums' order is fixed).
TEST(AddLayerNormGpu, WarpPerRowBackwardMatchesTheReference) {
  PRECIS_SKIP_WITHOUT_GPU();
  struct Case {
    Dtypes d;
    bool narrow_params;  // weight and biases in x's dtype (bf16-pure's norms)
  };
  const std::vector<Case> cases = {
      {{DType::bf16, DType::bf16, DType::bf16}, true}, {{DType::bf16, DType::bf16, DType::bf16}, false},
      {{DType::bf16, DType::bf16, DType::f32}, true},  {{DType::f16, DType::f16, DType::f32}, false},
      {{DType::f16, DType::f16, DType::f16}, true},    {{DType::f32, DType::f32, DType::f32}, false},
      {{DType::f32, DType::bf16, DType::bf16}, false}, {{DType::f32, DType::f16, DType::f32}, false}};
  const std::vector<std::pair<int64_t, int64_t>> sizes = {{16384, 768}, {1, 768}, {5, 256},   {3001, 512},
                                                          {777, 640},   {33, 8},  {2049, 264}};
  uint64_t seed = 5000;
  for (const Case& c : cases) {
    const Dtypes& d = c.d;
    for (auto [rows, C] : sizes) {
      if (rows == 16384 && d.y != d.x) continue;  // GPT-2's size for the uniform mixes only
      for (bool residual_bias : {true, false}) {
        SCOPED_TRACE(std::string(dtype_name(d.x)) + " + " + dtype_name(d.residual) + " -> " + dtype_name(d.y) + " [" +
                     std::to_string(rows) + ", " + std::to_string(C) + "]" +
                     (c.narrow_params ? ", narrow params" : "") + (residual_bias ? ", residual bias" : ""));
        const DType stats = DType::f32, params = c.narrow_params ? d.x : stats;
        Tensor x = values({rows, C}, ++seed, d.x, -3, 3), r = values({rows, C}, ++seed, d.residual, -3, 3);
        Tensor w = values({C}, ++seed, params, 0.5, 1.5), b = values({C}, ++seed, params);
        Tensor rb = residual_bias ? values({C}, ++seed, params, -2, 2) : Tensor();
        Tensor g = values({rows, C}, ++seed, d.y), g_sum = values({rows, C}, ++seed, d.x);
        const Tensor wg = w.to(kGpu), gg = g.to(kGpu), g_sum_g = g_sum.to(kGpu);

        Tensor sg = poisoned({rows, C}, d.x), y = poisoned({rows, C}, d.y);
        Tensor mean = poisoned({rows}, stats), rstd = poisoned({rows}, stats);
        ops::cuda::layer_norm_forward(x.to(kGpu), wg, b.to(kGpu), 1e-5, y, mean, rstd, r.to(kGpu), sg,
                                      residual_bias ? rb.to(kGpu) : Tensor());

        Tensor s64 = sg.to(DType::f64).to(kCpu).detach().set_requires_grad();
        Tensor w64 = w.to(DType::f64).set_requires_grad(), b64 = b.to(DType::f64).set_requires_grad();
        ops::layer_norm(s64, w64, b64).backward(g.to(DType::f64));
        const Tensor ds64 = s64.grad() + g_sum.to(DType::f64);
        const Tensor drb64 = ops::sum_to_shape(ds64, Shape{C});

        // dr only where its dtype differs from x's (the op then writes both).
        const bool split = d.residual != d.x;
        // The parameter sums written over poison, or (accumulate) added to 0.5.
        auto backward = [&](DType sums_dtype, bool accumulate = false) {
          auto sums = [&] { return accumulate ? full({C}, 0.5, sums_dtype, kGpu) : poisoned({C}, sums_dtype); };
          struct Out {
            Tensor ds, dr, dw, db, drb;
          } out{poisoned({rows, C}, d.x), split ? poisoned({rows, C}, d.residual) : Tensor(), sums(), sums(),
                residual_bias ? sums() : Tensor()};
          ops::cuda::layer_norm_backward(sg, gg, wg, mean, rstd, out.ds, out.dw, out.db, g_sum_g, out.dr, accumulate,
                                         accumulate, out.drb, accumulate);
          return out;
        };
        const auto first = backward(stats);
        expect_near(first.ds, ds64, d.x);
        if (split) expect_near(first.dr, ds64, d.residual);
        expect_near(first.dw, w64.grad(), stats);
        expect_near(first.db, b64.grad(), stats);
        if (residual_bias) expect_near(first.drb, drb64, stats);

        const auto again = backward(stats);
        expect_close(again.ds, first.ds, 0, 0);
        expect_close(again.dw, first.dw, 0, 0);
        expect_close(again.db, first.db, 0, 0);
        if (residual_bias) expect_close(again.drb, first.drb, 0, 0);

        // The .grad in x's dtype where that is 16-bit (precision.grad_dtype: the f32 sums rounded
        // once), written or added to; added to in f32 for f32 x. The same call as the first, so the
        // same grid and order of the sums.
        const DType grad_dtype = d.x == DType::f32 ? stats : d.x;
        if (grad_dtype != stats) {
          const auto narrow = backward(grad_dtype);
          expect_close(narrow.dw, first.dw.to(grad_dtype), 0, 0);
          expect_close(narrow.db, first.db.to(grad_dtype), 0, 0);
          if (residual_bias) expect_close(narrow.drb, first.drb.to(grad_dtype), 0, 0);
        }
        const auto added = backward(grad_dtype, true);
        expect_close(added.dw, ops::add(first.dw, 0.5).to(grad_dtype), 0, 0);
        expect_close(added.db, ops::add(first.db, 0.5).to(grad_dtype), 0, 0);
        if (residual_bias) expect_close(added.drb, ops::add(first.drb, 0.5).to(grad_dtype), 0, 0);

        // Without the sum's gradient (add_layer_norm's y alone, or a plain layer norm): the norm's dx.
        Tensor dx_norm = poisoned({rows, C}, d.x);
        Tensor drb_norm = residual_bias ? poisoned({C}, stats) : Tensor();
        ops::cuda::layer_norm_backward(sg, gg, wg, mean, rstd, dx_norm, Tensor(), Tensor(), Tensor(), Tensor(), false,
                                       false, drb_norm, false);
        expect_near(dx_norm, s64.grad(), d.x);
        if (residual_bias) expect_near(drb_norm, ops::sum_to_shape(s64.grad(), Shape{C}), stats);
      }
    }
  }
}

TEST(AddLayerNormGpu, NoRowsGiveZeroResidualBiasGradients) {
  PRECIS_SKIP_WITHOUT_GPU();
  const Tensor x = empty({0, 5}, DType::f32, kGpu), stats = empty({0}, DType::f32, kGpu);
  Tensor drb = poisoned({5}, DType::f32), kept = full({5}, 2.0, DType::f32, kGpu);
  ops::cuda::layer_norm_backward(x, x, full({5}, 1.0, DType::f32, kGpu), stats, stats, Tensor(), Tensor(), Tensor(), x,
                                 Tensor(), false, false, drb, false);
  expect_close(drb, zeros({5}), 0, 0);
  ops::cuda::layer_norm_backward(x, x, full({5}, 1.0, DType::f32, kGpu), stats, stats, Tensor(), Tensor(), Tensor(), x,
                                 Tensor(), false, false, kept, true);
  expect_close(kept, full({5}, 2.0), 0, 0);
}

#endif  // PRECIS_WITH_CUDA

TEST(AddLayerNormGpu, OpWithAResidualBiasMatchesTheCpu) {
  PRECIS_SKIP_WITHOUT_GPU();
  const Shape shape{2, 7, 96};
  struct Case {
    DType x, residual, bias;
    bool autocast;
  };
  // f32; the bf16 policy's stream (f32 x, bf16 branch, f32 c_proj bias); bf16-pure (bf16 bias) under autocast.
  for (const Case& c :
       {Case{DType::f32, DType::f32, DType::f32, false}, Case{DType::f32, DType::bf16, DType::f32, true},
        Case{DType::bf16, DType::bf16, DType::bf16, true}}) {
    for (int used : {0, 1, 2}) {  // both outputs, only the normed one, only the sum
      SCOPED_TRACE(std::string(dtype_name(c.x)) + " + " + dtype_name(c.residual) + " + " + dtype_name(c.bias) +
                   " bias" + (c.autocast ? " autocast" : "") + " outputs used " + std::to_string(used));
      Tensor x = values(shape, 1300, c.x, -2, 2), r = values(shape, 1301, c.residual, -2, 2);
      Tensor w = values({96}, 1302, DType::f32, 0.5, 1.5), b = values({96}, 1303, DType::f32);
      Tensor rb = values({96}, 1306, c.bias, -1, 1);
      Tensor g_sum = values(shape, 1304, DType::f64), g_normed = values(shape, 1305, DType::f64);
      auto run = [&](Device device) {
        ops::autocast::Scope scope(DType::bf16, c.autocast);
        std::vector<Tensor> leaves;
        for (const Tensor& t : {x, r, w, b, rb}) leaves.push_back(t.to(device).detach().set_requires_grad());
        ops::AddLayerNorm out =
            ops::add_layer_norm(leaves[0], leaves[1], leaves[2], leaves[3], 1e-5, std::nullopt, leaves[4]);
        Tensor loss = zeros({}, DType::f64, device);
        if (used != 2) loss = loss + ops::sum(out.normed.to(DType::f64) * g_normed.to(device));
        if (used != 1) loss = loss + ops::sum(out.sum.to(DType::f64) * g_sum.to(device));
        loss.backward();
        leaves.push_back(out.sum.detach());
        leaves.push_back(out.normed.detach());
        return leaves;
      };
      std::vector<Tensor> cpu = run(kCpu), gpu = run(kGpu);
      // The CPU rounds x + r and then + rb, the GPU the whole sum once (an ulp apart where they
      // cancel), and sums the rows' ds unrounded: the halves' tolerance, relative to the largest value.
      const DType tolerance = c.x == DType::bf16 || c.residual == DType::bf16 ? DType::bf16 : DType::f32;
      auto near = [&](const Tensor& on_gpu, const Tensor& on_cpu) {
        ASSERT_EQ(on_gpu.dtype(), on_cpu.dtype());
        expect_within(on_gpu, on_cpu, tolerance);
      };
      near(gpu[5], cpu[5]);
      near(gpu[6], cpu[6]);
      for (int i = 0; i < 5; ++i) {
        SCOPED_TRACE("gradient of input " + std::to_string(i));
        if (used == 2 && (i == 2 || i == 3)) {
          EXPECT_FALSE(gpu[i].grad().defined());
          continue;
        }
        ASSERT_TRUE(gpu[i].grad().defined());
        near(gpu[i].grad(), cpu[i].grad());
      }
    }
  }
}

TEST(AddLayerNormGpu, OpWithAutogradMatchesTheCpu) {
  PRECIS_SKIP_WITHOUT_GPU();
  const Shape shape{2, 7, 96};
  struct Case {
    DType x, residual;
    bool autocast;
  };
  // f32; the bf16 policy's residual stream (f32 x, bf16 attention output); bf16-pure under autocast.
  for (const Case& c : {Case{DType::f32, DType::f32, false}, Case{DType::f32, DType::bf16, true},
                        Case{DType::bf16, DType::bf16, true}, Case{DType::bf16, DType::f32, false}}) {
    for (int used : {0, 1, 2}) {  // both outputs, only the normed one, only the sum
      SCOPED_TRACE(std::string(dtype_name(c.x)) + " + " + dtype_name(c.residual) + (c.autocast ? " autocast" : "") +
                   " outputs used " + std::to_string(used));
      Tensor x = values(shape, 1100, c.x, -2, 2), r = values(shape, 1101, c.residual, -2, 2);
      Tensor w = values({96}, 1102, DType::f32, 0.5, 1.5), b = values({96}, 1103, DType::f32);
      Tensor g_sum = values(shape, 1104, DType::f64), g_normed = values(shape, 1105, DType::f64);
      auto run = [&](Device device) {
        ops::autocast::Scope scope(DType::bf16, c.autocast);
        std::vector<Tensor> leaves = {
            x.to(device).detach().set_requires_grad(), r.to(device).detach().set_requires_grad(),
            w.to(device).detach().set_requires_grad(), b.to(device).detach().set_requires_grad()};
        ops::AddLayerNorm out = ops::add_layer_norm(leaves[0], leaves[1], leaves[2], leaves[3]);
        Tensor loss = zeros({}, DType::f64, device);
        if (used != 2) loss = loss + ops::sum(out.normed.to(DType::f64) * g_normed.to(device));
        if (used != 1) loss = loss + ops::sum(out.sum.to(DType::f64) * g_sum.to(device));
        loss.backward();
        leaves.push_back(out.sum.detach());
        leaves.push_back(out.normed.detach());
        return leaves;
      };
      std::vector<Tensor> cpu = run(kCpu), gpu = run(kGpu);
      expect_matches(gpu[4], cpu[4]);
      expect_matches(gpu[5], cpu[5]);
      for (int i = 0; i < 4; ++i) {
        SCOPED_TRACE("gradient of input " + std::to_string(i));
        if (used == 2 && i >= 2) {
          EXPECT_FALSE(gpu[i].grad().defined());
          continue;
        }
        // Half gradients on both sides are roundings of nearly equal sums: the dtype's tolerance.
        expect_matches(
            gpu[i].grad(), cpu[i].grad(),
            tolerance_for(c.x == DType::bf16 || c.residual == DType::bf16 ? DType::bf16 : cpu[i].grad().dtype()));
      }
    }
  }
}

TEST(AddLayerNormGpu, OutputsStoredInTheLinearsDtypeMatchTheCpu) {
  PRECIS_SKIP_WITHOUT_GPU();
  // Under bf16 autocast, norms that feed a linear store bf16: the values the linear's cast gives.
  const Shape shape{3, 5, 64};
  Tensor x = values(shape, 1200, DType::f32, -2, 2), r = values(shape, 1201, DType::bf16, -2, 2);
  Tensor w = values({64}, 1202, DType::f32, 0.5, 1.5), b = values({64}, 1203, DType::f32);
  Tensor g = values(shape, 1204, DType::bf16);
  for (bool fused : {false, true}) {
    SCOPED_TRACE(fused ? "add_layer_norm" : "layer_norm");
    auto run = [&](Device device) {
      ops::autocast::Scope scope(DType::bf16);
      std::vector<Tensor> leaves;
      for (const Tensor& t : {x, r, w, b}) leaves.push_back(t.to(device).detach().set_requires_grad());
      const std::optional<DType> to_linear = ops::autocast::linear_input_dtype();
      Tensor y = fused ? ops::add_layer_norm(leaves[0], leaves[1], leaves[2], leaves[3], 1e-5, to_linear).normed
                       : ops::layer_norm(leaves[0], leaves[2], leaves[3], 1e-5, to_linear);
      EXPECT_EQ(y.dtype(), DType::bf16);
      y.backward(g.to(device));
      leaves.push_back(y.detach());
      return leaves;
    };
    std::vector<Tensor> cpu = run(kCpu), gpu = run(kGpu);
    expect_matches(gpu[4], cpu[4]);
    for (int i : {0, 2, 3}) expect_matches(gpu[i].grad(), cpu[i].grad(), tolerance_for(DType::bf16));
    if (fused) expect_matches(gpu[1].grad(), cpu[1].grad());
  }
}
