// Parameter gradients written by the GPU ops straight into the flat f32 gradient buffer
// (BackwardArgs::take_grad_destination, core/autograd.h): linear's and linear_gelu_linear's
// weight and bias gradients by cuBLASLt (f32 D from f16/bf16 operands, beta = 1 to add) and
// column_sums, layer norm's and batch norm's by their kernels. Parameters are views of one f32 buffer (or of a
// bf16 buffer beside an f32 gradient buffer, as in bf16-pure) and their .grad views of one
// f32 gradient buffer, NaN-filled and marked stale as zero_grad_lazily leaves them; the
// weight casts come from autocast::precache, as the trainer makes them. Checked:
//  - stale .grad written over, held .grad added to (a second backward: micro-batches);
//  - the products' f32 sums unrounded (within 1e-4 of a float64 reference, where the old
//    path's bf16 gradient is ~4e-3 off: so the direct path was taken);
//  - the same values as the copy path (fresh leaves, whose gradients the engine converts);
//  - a weight used by two products and an embedding (GPT-2's tied wte): the copy path's sum,
//    one grad-ready hook call with the final value;
//  - large products, whose first run autotunes: adding into .grad survives the timing.
// Skipped, with the reason, where no GPU is usable.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "core/autograd.h"
#include "core/copy.h"
#include "ops/autocast.h"
#include "ops/batch_norm.h"
#include "ops/conv.h"
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

#if PRECIS_WITH_CUDA

namespace {

// Values in [-1, 1) exactly representable in `dtype`, as f64 on the host.
Tensor exact_in(DType dtype, const Shape& shape, uint64_t seed) {
  return random_f64(shape, seed).to(dtype).to(DType::f64);
}

// Parameters as nn::flatten_parameters makes them: views of one buffer of `param_dtype` on
// the GPU, each .grad a view of one f32 buffer at the same offsets.
struct Flat {
  Tensor data, grad;
  std::vector<Tensor> params;

  Flat(const std::vector<Tensor>& values, DType param_dtype) {
    std::vector<int64_t> offsets;
    int64_t total = 0;
    for (const Tensor& v : values) {
      offsets.push_back(total);
      total += (v.numel() + 31) / 32 * 32;
    }
    data = empty({total}, param_dtype, kGpu);
    grad = full({total}, kNaN, DType::f32, kGpu);
    for (size_t i = 0; i < values.size(); ++i) {
      const Shape& shape = values[i].shape();
      Tensor p = data.as_strided(shape, contiguous_strides(shape), offsets[i]);
      copy_(p, values[i].to(param_dtype).to(kGpu));
      p.set_requires_grad();
      p.set_grad(grad.as_strided(shape, contiguous_strides(shape), offsets[i]));
      params.push_back(p);
    }
  }
  // As FlatParameters::zero_grad_lazily, with last step's values replaced by NaN: any not written over shows.
  void zero_grad_lazily() {
    fill_(grad, kNaN);
    for (Tensor& p : params) p.impl()->grad_is_stale = true;
  }
  // The trainer's weight casts for a step under autocast to `compute`.
  void precache(DType compute) {
    ops::autocast::clear_cache();
    if (data.dtype() != compute) ops::autocast::precache(data, params, compute);
  }
};

// The same parameters as fresh GPU leaves without .grad: the copy path (the engine converts
// and copies each gradient an op returns).
std::vector<Tensor> fresh_leaves(const std::vector<Tensor>& values, DType param_dtype) {
  std::vector<Tensor> leaves;
  for (const Tensor& v : values) leaves.push_back(v.to(param_dtype).to(kGpu).set_requires_grad());
  return leaves;
}

std::string name(DType dtype) { return dtype_name(dtype); }

}  // namespace

TEST(GradDestinationGpu, LinearWritesItsParameterGradientsIntoTheF32Buffer) {
  PRECIS_SKIP_WITHOUT_GPU();
  struct Case {
    Shape x;
    int64_t out;
  };
  // Odd sizes; GPT-2's attention projection (large enough to autotune, fused BGRADB against column sums).
  const Case cases[] = {{{37, 24}, 40}, {{3, 5, 33}, 17}, {{2, 128, 768}, 2304}};
  uint64_t seed = 1;
  for (bool fuse : {true, false}) {
    ops::cuda::set_fuse_epilogues(fuse);
    for (DType compute : {DType::bf16, DType::f16}) {
      for (bool pure : {false, true}) {  // f32 parameters under autocast, or parameters in the compute dtype
        for (const Case& c : cases) {
          const int64_t in = c.x.back();
          Shape y_shape = c.x;
          y_shape.back() = c.out;
          const std::string what = std::string(fuse ? "fused " : "unfused ") + name(compute) +
                                   (pure ? " parameters " : " autocast ") + detail::concat(c.x) + " -> " +
                                   std::to_string(c.out);
          const DType param_dtype = pure ? compute : DType::f32;
          const std::vector<Tensor> values = {exact_in(compute, {c.out, in}, seed),
                                              exact_in(compute, {c.out}, seed + 1)};
          const Tensor x = exact_in(compute, c.x, seed + 2), g1 = exact_in(compute, y_shape, seed + 3),
                       g2 = exact_in(compute, y_shape, seed + 4);
          seed += 5;
          // float64 references from the very values the GPU multiplies.
          const Tensor x2 = x.reshape({-1, in});
          auto dw_of = [&](const Tensor& g) { return ops::matmul(g.reshape({-1, c.out}).t(), x2); };
          auto db_of = [&](const Tensor& g) { return ops::sum(g.reshape({-1, c.out}), {0}); };

          Flat flat(values, param_dtype);
          auto step = [&](const std::vector<Tensor>& p, const Tensor& g) {
            ops::autocast::Scope scope(compute, !pure);
            Tensor y = ops::linear(x.to(pure ? compute : DType::f32).to(kGpu), p[0], p[1]);
            EXPECT_EQ(y.dtype(), compute) << what;
            y.backward(g.to(compute).to(kGpu));
          };
          flat.zero_grad_lazily();
          flat.precache(compute);
          step(flat.params, g1);
          EXPECT_FALSE(flat.params[0].impl()->grad_is_stale) << what;
          expect_near_magnitude(flat.params[0].grad(), dw_of(g1), 1e-4, what + ": weight gradient, written over");
          expect_near_magnitude(flat.params[1].grad(), db_of(g1), 1e-4, what + ": bias gradient, written over");
          // The copy path's gradients (rounded to the compute dtype, then widened) agree within it.
          const std::vector<Tensor> leaves = fresh_leaves(values, param_dtype);
          ops::autocast::clear_cache();
          step(leaves, g1);
          expect_near_magnitude(flat.params[0].grad(), leaves[0].grad(), 1e-2,
                                what + ": weight gradient against the copy path");
          expect_near_magnitude(flat.params[1].grad(), leaves[1].grad(), 1e-2,
                                what + ": bias gradient against the copy path");
          // A second micro-batch: added (beta = 1 and column sums adding; the large product autotunes
          // its adding form now, on a scratch output).
          flat.precache(compute);
          step(flat.params, g2);
          expect_near_magnitude(flat.params[0].grad(), ops::add(dw_of(g1), dw_of(g2)), 1e-4,
                                what + ": weight gradient, added");
          expect_near_magnitude(flat.params[1].grad(), ops::add(db_of(g1), db_of(g2)), 1e-4,
                                what + ": bias gradient, added");
          ops::autocast::clear_cache();
        }
      }
    }
  }
  ops::cuda::set_fuse_epilogues(true);
}

TEST(GradDestinationGpu, LinearGeluLinearWritesItsParameterGradientsIntoTheF32Buffer) {
  PRECIS_SKIP_WITHOUT_GPU();
  struct Case {
    Shape x;
    int64_t hidden, out;
  };
  // Odd sizes; GPT-2's MLP (large enough to autotune, DGELU_BGRAD against column sums).
  const Case cases[] = {{{2, 5, 13}, 9, 7}, {{3, 37, 96}, 65, 33}, {{2, 128, 768}, 3072, 768}};
  uint64_t seed = 100;
  for (bool fuse : {true, false}) {
    ops::cuda::set_fuse_epilogues(fuse);
    for (DType compute : {DType::bf16, DType::f16}) {
      for (const Case& c : cases) {
        const int64_t in = c.x.back();
        Shape y_shape = c.x;
        y_shape.back() = c.out;
        const std::string what = std::string(fuse ? "fused " : "unfused ") + name(compute) + " " + detail::concat(c.x) +
                                 " -> " + std::to_string(c.hidden) + " -> " + std::to_string(c.out);
        const std::vector<Tensor> values = {
            exact_in(compute, {c.hidden, in}, seed), exact_in(compute, {c.hidden}, seed + 1),
            exact_in(compute, {c.out, c.hidden}, seed + 2), exact_in(compute, {c.out}, seed + 3)};
        const Tensor x = exact_in(compute, c.x, seed + 4).to(DType::f32).to(kGpu),
                     g = exact_in(compute, y_shape, seed + 5).to(compute).to(kGpu);
        seed += 6;
        auto step = [&](const std::vector<Tensor>& p) {
          ops::autocast::Scope scope(compute);
          Tensor y = ops::linear_gelu_linear(x, p[0], p[1], p[2], p[3]);
          y.backward(g);
        };
        Flat flat(values, DType::f32);
        flat.zero_grad_lazily();
        flat.precache(compute);
        step(flat.params);
        std::vector<Tensor> first;
        for (const Tensor& p : flat.params) first.push_back(p.grad().clone());
        const std::vector<Tensor> leaves = fresh_leaves(values, DType::f32);
        ops::autocast::clear_cache();
        step(leaves);
        const char* names[] = {"first weight", "first bias", "second weight", "second bias"};
        for (size_t i = 0; i < 4; ++i) {
          expect_near_magnitude(first[i], leaves[i].grad(), 2e-2, what + ": " + names[i] + " against the copy path");
        }
        // The same micro-batch again: each gradient doubles.
        flat.precache(compute);
        step(flat.params);
        for (size_t i = 0; i < 4; ++i) {
          expect_near_magnitude(flat.params[i].grad(), ops::mul(first[i], 2.0), 1e-4,
                                what + ": " + names[i] + ", added");
        }
        ops::autocast::clear_cache();
      }
    }
  }
  ops::cuda::set_fuse_epilogues(true);
}

TEST(GradDestinationGpu, TiedWeightGetsTheCopyPathsSumAndOneHookCall) {
  PRECIS_SKIP_WITHOUT_GPU();
  // GPT-2's wte: the classifier's weight (through the autocast cast) and the embedding's
  // table; here also a second product. Two writers into .grad, and the embedding's
  // gradient added by AccumulateGrad after them.
  const int64_t V = 96, C = 64, N = 300;
  for (DType compute : {DType::bf16, DType::f16}) {
    for (bool stale : {true, false}) {
      const std::string what = name(compute) + (stale ? ", stale .grad" : ", held .grad");
      const std::vector<Tensor> values = {exact_in(compute, {V, C}, 200)};
      const Tensor h1 = exact_in(compute, {N, C}, 201).to(DType::f32).to(kGpu),
                   h2 = exact_in(compute, {7, C}, 202).to(DType::f32).to(kGpu);
      std::vector<int64_t> rows(N);
      for (int64_t i = 0; i < N; ++i) rows[i] = (i * 7) % V;  // every row of the table, most several times
      const Tensor idx = from_vector(rows, {N}).to(kGpu);
      const Tensor c1 = exact_in(compute, {N, V}, 203).to(DType::f32).to(kGpu),
                   c2 = exact_in(compute, {N, C}, 204).to(DType::f32).to(kGpu);
      auto loss_of = [&](const Tensor& w) {
        ops::autocast::Scope scope(compute);
        Tensor logits = ops::linear(h1, w), other = ops::linear(h2, w), e = ops::embedding(w, idx);
        return ops::sum(ops::mul(logits, c1)) + ops::sum(other) + ops::sum(ops::mul(e, c2));
      };
      Flat flat(values, DType::f32);
      Tensor w = flat.params[0];
      flat.zero_grad_lazily();
      if (!stale) {
        fill_(flat.grad, 0.5);
        w.impl()->grad_is_stale = false;
      }
      int hooks = 0;
      Tensor at_hook;
      w.register_grad_ready_hook([&](const Tensor& g) {
        ++hooks;
        at_hook = g.clone();
      });
      flat.precache(compute);
      loss_of(w).backward();
      EXPECT_EQ(hooks, 1) << what;
      ASSERT_TRUE(at_hook.defined()) << what;
      expect_near_magnitude(w.grad(), at_hook, 0, what + ": the hook saw the final gradient");

      Tensor ref = fresh_leaves(values, DType::f32)[0];
      ops::autocast::clear_cache();
      loss_of(ref).backward();
      const Tensor expected = stale ? ref.grad() : ops::add(ref.grad(), 0.5);
      expect_near_magnitude(w.grad(), expected, 1e-2, what + ": against the copy path");
      ops::autocast::clear_cache();
    }
  }
}

TEST(GradDestinationGpu, LayerNormWritesItsParameterGradientsIntoTheF32Buffer) {
  PRECIS_SKIP_WITHOUT_GPU();
  const int64_t rows = 515, C = 768;
  // weight, bias and (add_layer_norm) the residual's bias, c_proj's in a transformer block.
  const std::vector<Tensor> all_values = {exact_in(DType::bf16, {C}, 300), exact_in(DType::bf16, {C}, 301),
                                          exact_in(DType::bf16, {C}, 306)};
  const Tensor x = exact_in(DType::bf16, {rows, C}, 302), r = exact_in(DType::bf16, {rows, C}, 303),
               g = exact_in(DType::bf16, {rows, C}, 304).to(DType::f32).to(kGpu),
               g_sum = exact_in(DType::bf16, {rows, C}, 305).to(DType::f32).to(kGpu);
  for (bool add : {false, true}) {
    const std::vector<Tensor> values(all_values.begin(), all_values.begin() + (add ? 3 : 2));
    // f32 parameters (policy bf16), and bf16 ones with f32 gradients (bf16-pure, whose old path
    // rounded dw and db to bf16 before widening them again).
    std::vector<Tensor> f32_first;
    for (DType param_dtype : {DType::f32, DType::bf16}) {
      const std::string what =
          std::string(add ? "add_layer_norm" : "layer_norm") + " with " + name(param_dtype) + " parameters";
      const DType act = param_dtype;  // activations in the parameters' dtype, as in those policies
      auto step = [&](const std::vector<Tensor>& p) {
        const Tensor xa = x.to(act).to(kGpu), ra = r.to(act).to(kGpu);
        if (add) {
          ops::AddLayerNorm out = ops::add_layer_norm(xa, ra, p[0], p[1], 1e-5, std::nullopt, p[2]);
          (ops::sum(ops::mul(out.normed, g)) + ops::sum(ops::mul(out.sum, g_sum))).backward();
        } else {
          ops::layer_norm(xa, p[0], p[1]).backward(g.to(act));
        }
      };
      Flat flat(values, param_dtype);
      flat.zero_grad_lazily();
      step(flat.params);
      std::vector<Tensor> first;
      for (const Tensor& p : flat.params) first.push_back(p.grad().clone());
      const std::vector<Tensor> leaves = fresh_leaves(values, param_dtype);
      step(leaves);
      for (size_t i = 0; i < values.size(); ++i) {
        const std::string which = i == 0   ? ": weight gradient"
                                  : i == 1 ? ": bias gradient"
                                           : ": residual bias gradient";
        EXPECT_EQ(leaves[i].grad().dtype(), param_dtype);
        expect_near_magnitude(first[i], leaves[i].grad(), param_dtype == DType::f32 ? 0 : 1e-2,
                              what + which + " against the copy path");
        // dw = sum g xhat and db = sum g do not depend on the weight: in f32, as the f32 parameters'
        // (unrounded). Not for add_layer_norm: there the bf16 sum x + r is rounded, the f32 one not.
        if (param_dtype == DType::bf16 && !add)
          expect_near_magnitude(first[i], f32_first[i], 1e-6, what + which + " kept in f32");
      }
      if (param_dtype == DType::f32) f32_first = first;
      step(flat.params);  // added
      for (size_t i = 0; i < values.size(); ++i)
        expect_near_magnitude(flat.params[i].grad(), ops::mul(first[i], 2.0), 1e-6, what + ", added");
    }
  }
}

// batch_norm's (and its relu and add-relu variants') weight and bias gradients, written by its
// finalize kernel into the stale f32 .grad, then added to it; the same as the copy path.
TEST(GradDestinationGpu, BatchNormWritesItsParameterGradientsIntoTheF32Buffer) {
  PRECIS_SKIP_WITHOUT_GPU();
  const int64_t C = 64;
  const std::vector<Tensor> values = {exact_in(DType::bf16, {C}, 400), exact_in(DType::bf16, {C}, 401)};
  const Tensor x = exact_in(DType::bf16, {8, C, 6, 6}, 402), r = exact_in(DType::bf16, {8, C, 6, 6}, 403),
               g = exact_in(DType::bf16, {8, C, 6, 6}, 404);
  for (int variant = 0; variant < 3; ++variant) {
    for (DType param_dtype : {DType::f32, DType::bf16}) {
      const std::string what = std::string(variant == 0   ? "batch_norm"
                                           : variant == 1 ? "batch_norm_relu"
                                                          : "batch_norm_add_relu") +
                               " with " + name(param_dtype) + " parameters";
      auto step = [&](const std::vector<Tensor>& p) {
        const auto cl = ops::MemoryFormat::channels_last;
        const Tensor xa = ops::to_memory_format(x.to(DType::bf16).to(kGpu), cl);
        const Tensor ra = ops::to_memory_format(r.to(DType::bf16).to(kGpu), cl);
        Tensor y = variant == 0   ? ops::batch_norm(xa, p[0], p[1], Tensor(), Tensor(), true)
                   : variant == 1 ? ops::batch_norm_relu(xa, p[0], p[1], Tensor(), Tensor(), true)
                                  : ops::batch_norm_add_relu(xa, ra, p[0], p[1], Tensor(), Tensor(), true);
        y.backward(ops::to_memory_format(g.to(DType::bf16).to(kGpu), cl));
      };
      Flat flat(values, param_dtype);
      flat.zero_grad_lazily();
      step(flat.params);
      std::vector<Tensor> first;
      for (const Tensor& p : flat.params) first.push_back(p.grad().clone());
      const std::vector<Tensor> leaves = fresh_leaves(values, param_dtype);
      step(leaves);
      for (size_t i = 0; i < values.size(); ++i) {
        const std::string which = i == 0 ? ": weight gradient" : ": bias gradient";
        EXPECT_EQ(leaves[i].grad().dtype(), param_dtype);
        // the copy path rounds a bf16 parameter's f32 gradient to bf16
        expect_near_magnitude(first[i], leaves[i].grad(), param_dtype == DType::f32 ? 0 : 1e-2,
                              what + which + " against the copy path");
      }
      step(flat.params);  // added
      for (size_t i = 0; i < values.size(); ++i)
        expect_near_magnitude(flat.params[i].grad(), ops::mul(first[i], 2.0), 1e-6, what + ", added");
    }
  }
}

#else

TEST(GradDestinationGpu, NeedsACudaBuild) { GTEST_SKIP() << "built without CUDA (PRECIS_CUDA=OFF)"; }

#endif  // PRECIS_WITH_CUDA
