#include <gtest/gtest.h>

#include <cmath>

#include "ops/autocast.h"
#include "ops/ops.h"
#include "support/errors.h"
#include "support/gradcheck.h"

using namespace precis;
using precis::testing::expect_close;
using precis::testing::expect_error;
using precis::testing::expect_gradients_match;
using precis::testing::random_f64;

namespace {

// layer_norm in plain double loops over rows of the last dim, as the reference (f64).
Tensor reference_layer_norm(const Tensor& x, const Tensor& w, const Tensor& b, double eps) {
  const int64_t C = x.shape().back();
  std::vector<double> v = x.to_vector<double>(), out(v.size());
  std::vector<double> wv = w.defined() ? w.to_vector<double>() : std::vector<double>(C, 1.0);
  std::vector<double> bv = b.defined() ? b.to_vector<double>() : std::vector<double>(C, 0.0);
  for (size_t base = 0; base < v.size(); base += C) {
    double mean = 0, var = 0;
    for (int64_t j = 0; j < C; ++j) mean += v[base + j] / C;
    for (int64_t j = 0; j < C; ++j) var += (v[base + j] - mean) * (v[base + j] - mean) / C;
    for (int64_t j = 0; j < C; ++j) out[base + j] = (v[base + j] - mean) / std::sqrt(var + eps) * wv[j] + bv[j];
  }
  return from_vector(out, x.shape());
}

}  // namespace

TEST(LayerNorm, HandComputedValues) {
  // mean 2, biased variance 2/3: (x - 2) / sqrt(2/3 + 1e-5)
  Tensor x = tensor({1, 2, 3}, DType::f64);
  const double a = 1 / std::sqrt(2.0 / 3 + 1e-5);
  expect_close(ops::layer_norm(x, ones({3}, DType::f64), zeros({3}, DType::f64)), tensor({-a, 0, a}, DType::f64),
               1e-12);
  expect_close(ops::layer_norm(x, Tensor(), Tensor()), tensor({-1.2247357, 0, 1.2247357}, DType::f64), 1e-6);
  // weight scales and bias shifts each column.
  Tensor w = tensor({2, 3, 4}, DType::f64), b = tensor({1, -1, 0.5}, DType::f64);
  expect_close(ops::layer_norm(x, w, b), tensor({-2 * a + 1, -1, 4 * a + 0.5}, DType::f64), 1e-12);
  expect_close(ops::layer_norm(x, Tensor(), b), tensor({-a + 1, -1, a + 0.5}, DType::f64), 1e-12);
  // eps matters for a constant row: 0 / sqrt(0 + eps).
  expect_close(ops::layer_norm(tensor({5, 5}), Tensor(), Tensor(), 0.25), tensor({0, 0}));
  // Rows are normalised independently.
  Tensor rows = tensor({1, 2, 3, 10, 20, 30}).reshape({2, 3});
  expect_close(ops::layer_norm(rows, Tensor(), Tensor()),
               tensor({-1.2247357, 0, 1.2247357, -1.2247449, 0, 1.2247449}).reshape({2, 3}), 1e-6);
}

TEST(LayerNorm, MatchesTheCompositionOnRandomAndStridedInputs) {
  Tensor x = random_f64({2, 3, 7}, 60, -3, 3), w = random_f64({7}, 61), b = random_f64({7}, 62);
  expect_close(ops::layer_norm(x, w, b, 1e-5), reference_layer_norm(x, w, b, 1e-5), 1e-12);
  Tensor xt = random_f64({7, 4}, 63).t();  // [4, 7], rows strided
  Tensor w7 = random_f64({7}, 64);
  expect_close(ops::layer_norm(xt, w7, Tensor(), 1e-3), reference_layer_norm(xt, w7, Tensor(), 1e-3), 1e-12);
}

TEST(LayerNorm, HalfDtypesComputeInFloatAndRound) {
  Tensor x = random_f64({5, 16}, 65, -2, 2), w = random_f64({16}, 66), b = random_f64({16}, 67);
  for (DType dtype : {DType::f16, DType::bf16}) {
    Tensor xh = x.to(dtype);
    Tensor y = ops::layer_norm(xh, w.to(dtype), b.to(dtype));
    EXPECT_EQ(y.dtype(), dtype);
    expect_close(y,
                 reference_layer_norm(xh.to(DType::f64), w.to(dtype).to(DType::f64), b.to(dtype).to(DType::f64), 1e-5),
                 2e-2, 1e-2);
  }
  // f32 parameters with a bf16 input: the output keeps the input's dtype.
  Tensor mixed = ops::layer_norm(x.to(DType::bf16), w.to(DType::f32), b.to(DType::f32));
  EXPECT_EQ(mixed.dtype(), DType::bf16);
}

TEST(LayerNorm, GradientsOfEachInputAreInItsDtype) {
  Tensor x = random_f64({3, 8}, 68).to(DType::bf16).set_requires_grad();
  Tensor w = full({8}, 2.0, DType::f32).set_requires_grad();
  Tensor b = random_f64({8}, 70).to(DType::f32).set_requires_grad();
  ops::sum(ops::layer_norm(x, w, b)).backward();
  EXPECT_EQ(x.grad().dtype(), DType::bf16);
  EXPECT_EQ(w.grad().dtype(), DType::f32);
  EXPECT_EQ(b.grad().dtype(), DType::f32);
  // For sum(y): db = number of rows, dw = sum of xhat over rows, and with a constant weight
  // dx = rstd (w - w - xhat mean(w xhat)) = 0, because xhat has mean 0 in every row.
  expect_close(b.grad(), full({8}, 3.0));
  Tensor xhat = reference_layer_norm(x.detach().to(DType::f64), Tensor(), Tensor(), 1e-5);
  expect_close(w.grad(), ops::sum(xhat, {0}), 1e-4, 1e-4);
  expect_close(x.grad(), zeros({3, 8}), 2e-2);
}

TEST(LayerNorm, ManyRowsInParallelMatchOneRowAtATime) {
  // 128 rows of 300: the parallel path, with per-thread weight and bias gradients.
  Tensor x = random_f64({128, 300}, 71, -2, 2), w = random_f64({300}, 72), b = random_f64({300}, 73);
  Tensor g = random_f64({128, 300}, 74);
  Tensor xr = x.detach().set_requires_grad(), wr = w.detach().set_requires_grad(), br = b.detach().set_requires_grad();
  Tensor y = ops::layer_norm(xr, wr, br);
  expect_close(y, reference_layer_norm(x, w, b, 1e-5), 1e-12);
  ops::sum(y * g).backward();
  // Each row alone takes the one-thread path; dw and db are the sums of the rows' gradients.
  Tensor dw = zeros({300}, DType::f64), db = zeros({300}, DType::f64);
  for (int64_t r = 0; r < 128; ++r) {
    Tensor x1 = x.select(0, r).contiguous().set_requires_grad();
    Tensor w1 = w.detach().set_requires_grad(), b1 = b.detach().set_requires_grad();
    ops::sum(ops::layer_norm(x1, w1, b1) * g.select(0, r)).backward();
    expect_close(xr.grad().select(0, r), x1.grad(), 1e-12);
    dw = dw + w1.grad();
    db = db + b1.grad();
  }
  expect_close(wr.grad(), dw, 1e-10);
  expect_close(br.grad(), db, 1e-10);
}

TEST(LayerNorm, Errors) {
  Tensor x = zeros({2, 5});
  expect_error([&] { ops::layer_norm(x, zeros({4}), Tensor()); },
               "layer_norm: weight must be [5] (the last dim of input float32[2, 5] on cpu), got float32[4] on cpu");
  expect_error([&] { ops::layer_norm(x, Tensor(), zeros({5, 1})); }, "layer_norm: bias must be [5]");
  expect_error([&] { ops::layer_norm(arange(0, 3), Tensor(), Tensor()); },
               "layer_norm: input must be a floating tensor, got int64[3] on cpu");
  expect_error([&] { ops::layer_norm(x, arange(0, 5), Tensor()); },
               "layer_norm: weight must be a floating tensor, got int64[5] on cpu");
  expect_error([&] { ops::layer_norm(scalar_tensor(1), Tensor(), Tensor()); },
               "layer_norm: input must have at least 1 dim");
  expect_error([&] { ops::layer_norm(Tensor(), Tensor(), Tensor()); }, "layer_norm: input is an undefined tensor");
}

TEST(LayerNorm, GradientsMatchFiniteDifferences) {
  for (const Shape& shape : {Shape{3, 5}, Shape{2, 3, 7}, Shape{4}}) {
    const int64_t C = shape.back();
    Tensor x = random_f64(shape, 75, -2, 2), w = random_f64({C}, 76, 0.5, 1.5), b = random_f64({C}, 77);
    expect_gradients_match([](const std::vector<Tensor>& in) { return ops::layer_norm(in[0], in[1], in[2]); },
                           {x, w, b});
    expect_gradients_match([](const std::vector<Tensor>& in) { return ops::layer_norm(in[0], Tensor(), Tensor()); },
                           {x});
    expect_gradients_match([](const std::vector<Tensor>& in) { return ops::layer_norm(in[0], in[1], Tensor(), 0.1); },
                           {x, w});
    expect_gradients_match([](const std::vector<Tensor>& in) { return ops::layer_norm(in[0], Tensor(), in[1]); },
                           {x, b});
  }
  Tensor t = random_f64({5, 3}, 78).t();
  expect_gradients_match([](const std::vector<Tensor>& in) { return ops::layer_norm(in[0], Tensor(), Tensor()); }, {t});
}

TEST(LayerNorm, OutDtypeRoundsTheResultOnce) {
  Tensor x = random_f64({4, 9}, 87, -2, 2).to(DType::f32), w = random_f64({9}, 88).to(DType::f32);
  for (DType dtype : {DType::bf16, DType::f16, DType::f64}) {
    Tensor xa = x.detach().set_requires_grad(), xb = x.detach().set_requires_grad();
    Tensor y = ops::layer_norm(xa, w, Tensor(), 1e-5, dtype), expected = ops::layer_norm(xb, w, Tensor()).to(dtype);
    EXPECT_EQ(y.dtype(), dtype);
    expect_close(y, expected, 0, 0);
    Tensor g = random_f64({4, 9}, 89).to(dtype);
    y.backward(g);
    expected.backward(g);
    expect_close(xa.grad(), xb.grad(), 0, 0);
  }
  // With autocast on, out_dtype overrides the f32 result.
  ops::autocast::Scope scope(DType::bf16);
  EXPECT_EQ(ops::layer_norm(x.to(DType::bf16), Tensor(), Tensor()).dtype(), DType::f32);
  EXPECT_EQ(ops::layer_norm(x, Tensor(), Tensor(), 1e-5, ops::autocast::linear_input_dtype()).dtype(), DType::bf16);
}

// ---------------------------------------------------------------- add_layer_norm

TEST(AddLayerNorm, IsTheResidualAddThenTheNorm) {
  Tensor x = random_f64({2, 3, 7}, 79, -3, 3), r = random_f64({2, 3, 7}, 80, -3, 3);
  Tensor w = random_f64({7}, 81, 0.5, 1.5), b = random_f64({7}, 82);
  ops::AddLayerNorm out = ops::add_layer_norm(x, r, w, b, 1e-3);
  expect_close(out.sum, x + r, 0, 0);
  expect_close(out.normed, reference_layer_norm(x + r, w, b, 1e-3), 1e-12);
  // Dtypes promote as in add; the norm keeps the sum's dtype, or runs in f32 under autocast.
  Tensor x32 = x.to(DType::f32), r16 = r.to(DType::bf16);
  ops::AddLayerNorm mixed = ops::add_layer_norm(x32, r16, w.to(DType::f32), Tensor());
  EXPECT_EQ(mixed.sum.dtype(), DType::f32);
  EXPECT_EQ(mixed.normed.dtype(), DType::f32);
  expect_close(mixed.sum, x32 + r16, 0, 0);
  ops::AddLayerNorm halves = ops::add_layer_norm(x.to(DType::bf16), r16, Tensor(), Tensor());
  EXPECT_EQ(halves.normed.dtype(), DType::bf16);
  {
    ops::autocast::Scope scope(DType::bf16);
    ops::AddLayerNorm autocast = ops::add_layer_norm(x.to(DType::bf16), r16, Tensor(), Tensor());
    EXPECT_EQ(autocast.sum.dtype(), DType::bf16);
    EXPECT_EQ(autocast.normed.dtype(), DType::f32);
    expect_close(autocast.normed, ops::layer_norm(autocast.sum.to(DType::f32), Tensor(), Tensor()), 0, 0);
  }
}

TEST(AddLayerNorm, GradientsMatchFiniteDifferences) {
  // Both outputs used (as in a block: the sum goes on down the residual stream), or either alone.
  for (const Shape& shape : {Shape{3, 5}, Shape{2, 3, 7}, Shape{4}}) {
    const int64_t C = shape.back();
    Tensor x = random_f64(shape, 83, -2, 2), r = random_f64(shape, 84, -2, 2);
    Tensor w = random_f64({C}, 85, 0.5, 1.5), b = random_f64({C}, 86);
    expect_gradients_match(
        [](const std::vector<Tensor>& in) {
          ops::AddLayerNorm out = ops::add_layer_norm(in[0], in[1], in[2], in[3]);
          return out.sum * 0.75 + out.normed;
        },
        {x, r, w, b});
    expect_gradients_match(
        [](const std::vector<Tensor>& in) { return ops::add_layer_norm(in[0], in[1], in[2], Tensor()).normed; },
        {x, r, w});
    expect_gradients_match(
        [&](const std::vector<Tensor>& in) { return ops::add_layer_norm(in[0], in[1], Tensor(), b, 0.1).sum; }, {x, r});
  }
}

// The residual's bias (add_layer_norm's residual_bias): sum = x + r + rb, rb added to every row.
TEST(AddLayerNorm, ResidualBiasIsAddedToEveryRow) {
  Tensor x = random_f64({2, 3, 7}, 90, -3, 3), r = random_f64({2, 3, 7}, 91, -3, 3);
  Tensor w = random_f64({7}, 92, 0.5, 1.5), b = random_f64({7}, 93), rb = random_f64({7}, 94, -2, 2);
  ops::AddLayerNorm out = ops::add_layer_norm(x, r, w, b, 1e-3, std::nullopt, rb);
  const Tensor composite = x + r + rb;
  expect_close(out.sum, composite, 1e-15, 0);
  expect_close(out.normed, reference_layer_norm(composite, w, b, 1e-3), 1e-12);
  // The sum keeps the operands' dtype: an f32 bias beside bf16 operands is cast to bf16.
  ops::AddLayerNorm halves = ops::add_layer_norm(x.to(DType::bf16), r.to(DType::bf16), Tensor(), Tensor(), 1e-5,
                                                 std::nullopt, rb.to(DType::f32));
  EXPECT_EQ(halves.sum.dtype(), DType::bf16);
  expect_close(halves.sum, x.to(DType::bf16) + r.to(DType::bf16) + rb.to(DType::bf16), 0, 0);
  // Without a bias, the same as before.
  expect_close(ops::add_layer_norm(x, r, w, b, 1e-3, std::nullopt, Tensor()).normed,
               ops::add_layer_norm(x, r, w, b, 1e-3).normed, 0, 0);
}

TEST(AddLayerNorm, ResidualBiasGradientsMatchTheCompositeAndFiniteDifferences) {
  for (const Shape& shape : {Shape{3, 5}, Shape{2, 3, 7}, Shape{4}, Shape{1, 9}}) {
    const int64_t C = shape.back();
    Tensor x = random_f64(shape, 95, -2, 2), r = random_f64(shape, 96, -2, 2);
    SCOPED_TRACE(describe(x));
    Tensor w = random_f64({C}, 97, 0.5, 1.5), b = random_f64({C}, 98), rb = random_f64({C}, 99);
    // Both outputs used, the normed one alone, the sum alone.
    for (int used : {0, 1, 2}) {
      auto fused = [used](const std::vector<Tensor>& in) {
        ops::AddLayerNorm out = ops::add_layer_norm(in[0], in[1], in[2], in[3], 1e-5, std::nullopt, in[4]);
        return used == 0 ? out.sum * 0.75 + out.normed : used == 1 ? out.normed : out.sum * out.sum;
      };
      auto composite = [used](const std::vector<Tensor>& in) {
        const Tensor sum = in[0] + in[1] + in[4];
        const Tensor normed = ops::layer_norm(sum, in[2], in[3], 1e-5);
        return used == 0 ? sum * 0.75 + normed : used == 1 ? normed : sum * sum;
      };
      if (used != 2) expect_gradients_match(fused, {x, r, w, b, rb});  // (the sum alone leaves w and b without one)
      // Against the composite's autograd gradients, every input (the bias too).
      auto grads = [&](auto fn) {
        std::vector<Tensor> leaves;
        for (const Tensor& t : {x, r, w, b, rb}) leaves.push_back(t.detach().set_requires_grad());
        Tensor out = fn(leaves);
        ops::sum(out * random_f64(out.shape(), 100)).backward();
        std::vector<Tensor> result;
        for (const Tensor& leaf : leaves) result.push_back(leaf.grad());
        return result;
      };
      std::vector<Tensor> got = grads(fused), want = grads(composite);
      for (size_t i = 0; i < got.size(); ++i) {
        SCOPED_TRACE("input " + std::to_string(i) + ", outputs used " + std::to_string(used));
        if (used == 2 && (i == 2 || i == 3)) {
          EXPECT_FALSE(got[i].defined());
          continue;
        }
        ASSERT_TRUE(got[i].defined());
        expect_close(got[i], want[i], 1e-12, 1e-12);
      }
    }
  }
}

TEST(AddLayerNorm, Errors) {
  Tensor x = zeros({2, 5});
  expect_error(
      [&] {
        ops::add_layer_norm(x, zeros({1, 5}), Tensor(), Tensor());
      },
      "add_layer_norm: input float32[2, 5] on cpu and residual float32[1, 5] on cpu must have one shape");
  expect_error([&] { ops::add_layer_norm(x, Tensor(), Tensor(), Tensor()); },
               "add_layer_norm: residual is an undefined tensor");
  expect_error(
      [&] {
        ops::add_layer_norm(x, zeros({2, 5}, DType::i64), Tensor(), Tensor());
      },
      "add_layer_norm: residual must be a floating tensor, got int64[2, 5] on cpu");
  expect_error([&] { ops::add_layer_norm(x, x, zeros({4}), Tensor()); }, "layer_norm: weight must be [5]");
  expect_error(
      [&] {
        ops::add_layer_norm(x, x, Tensor(), Tensor(), 1e-5, std::nullopt, zeros({2, 5}));
      },
      "add_layer_norm: residual_bias must be [5] (the last dim of input float32[2, 5] on cpu), got "
      "float32[2, 5] on cpu");
  expect_error([&] { ops::add_layer_norm(x, x, Tensor(), Tensor(), 1e-5, std::nullopt, zeros({5}, DType::i32)); },
               "add_layer_norm: residual_bias must be a floating tensor");
}
