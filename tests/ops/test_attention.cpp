#include <gtest/gtest.h>

#include <cmath>

#include "core/random.h"
#include "ops/ops.h"
#include "support/errors.h"
#include "support/gradcheck.h"

using namespace precis;
using precis::testing::error_of;
using precis::testing::expect_close;
using precis::testing::expect_gradients_match;
using precis::testing::random_f64;

namespace {

// Attention weights p[b, i, j] computed directly in double: the softmax over the
// keys j a query i may see of scale * q_i . k_j. q: [B, Tq, D], k: [B, Tk, D],
// with B all the leading dims folded; causal hides j > i (top-left aligned).
std::vector<double> reference_weights(const Tensor& q, const Tensor& k, bool causal, double scale) {
  const int64_t D = q.size(-1), Tq = q.size(-2), Tk = k.size(-2), B = q.numel() / (Tq * D);
  std::vector<double> qv = q.to_vector<double>(), kv = k.to_vector<double>();
  std::vector<double> p(B * Tq * Tk, 0.0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < Tq; ++i) {
      const int64_t visible = causal ? std::min(i + 1, Tk) : Tk;
      std::vector<double> score(visible);
      double max_score = -INFINITY;
      for (int64_t j = 0; j < visible; ++j) {
        double dot = 0;
        for (int64_t d = 0; d < D; ++d) dot += qv[(b * Tq + i) * D + d] * kv[(b * Tk + j) * D + d];
        score[j] = scale * dot;
        max_score = std::max(max_score, score[j]);
      }
      double total = 0;
      for (int64_t j = 0; j < visible; ++j) total += std::exp(score[j] - max_score);
      for (int64_t j = 0; j < visible; ++j) p[(b * Tq + i) * Tk + j] = std::exp(score[j] - max_score) / total;
    }
  return p;
}

// out[b, i, :] = sum_j p[b, i, j] v[b, j, :], as a tensor of q's leading dims with v's last dim.
Tensor reference_output(const std::vector<double>& p, const Tensor& q, const Tensor& v) {
  const int64_t Tq = q.size(-2), Tk = v.size(-2), Dv = v.size(-1), B = q.numel() / (Tq * q.size(-1));
  std::vector<double> vv = v.to_vector<double>(), out(B * Tq * Dv, 0.0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < Tq; ++i)
      for (int64_t j = 0; j < Tk; ++j)
        for (int64_t e = 0; e < Dv; ++e)
          out[(b * Tq + i) * Dv + e] += p[(b * Tq + i) * Tk + j] * vv[(b * Tk + j) * Dv + e];
  Shape shape = q.shape();
  shape.back() = Dv;
  return from_vector(out, shape);
}

Tensor reference_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double scale) {
  return reference_output(reference_weights(q, k, causal, scale), q, v);
}

}  // namespace

TEST(Attention, HandComputedSingleQuery) {
  // One query [1, 0] against keys [1, 0] and [0, 1], scale 1: weights softmax(1, 0).
  Tensor q = tensor({1, 0}, DType::f64).reshape({1, 2});
  Tensor k = tensor({1, 0, 0, 1}, DType::f64).reshape({2, 2});
  Tensor v = tensor({10, 0, 0, 20}, DType::f64).reshape({2, 2});
  double w0 = std::exp(1.0) / (std::exp(1.0) + 1.0), w1 = 1.0 - w0;
  expect_close(ops::scaled_dot_product_attention(q, k, v, false, 0.0, 1.0),
               tensor({10 * w0, 20 * w1}, DType::f64).reshape({1, 2}), 1e-12, 1e-12);
  // Default scale 1/sqrt(2); causal with Tq = 1 sees only key 0, so the output is v[0].
  double d0 = std::exp(1 / std::sqrt(2.0)) / (std::exp(1 / std::sqrt(2.0)) + 1.0);
  expect_close(ops::scaled_dot_product_attention(q, k, v), tensor({10 * d0, 20 * (1 - d0)}, DType::f64).reshape({1, 2}),
               1e-12, 1e-12);
  expect_close(ops::scaled_dot_product_attention(q, k, v, true), tensor({10, 0}, DType::f64).reshape({1, 2}), 1e-12,
               1e-12);
}

TEST(Attention, MatchesReferenceLoop) {
  for (bool causal : {false, true})
    for (int64_t T : {5, 7})
      for (int64_t D : {3, 4}) {
        SCOPED_TRACE(::testing::Message() << "causal " << causal << ", T " << T << ", D " << D);
        Tensor q = random_f64({2, 2, T, D}, 1, -2, 2), k = random_f64({2, 2, T, D}, 2, -2, 2);
        Tensor v = random_f64({2, 2, T, D}, 3);
        expect_close(ops::scaled_dot_product_attention(q, k, v, causal),
                     reference_attention(q, k, v, causal, 1.0 / std::sqrt(static_cast<double>(D))), 1e-12, 1e-10);
        // Value head size differing from D, and an explicit scale.
        Tensor v2 = random_f64({2, 2, T, 2}, 4);
        expect_close(ops::scaled_dot_product_attention(q, k, v2, causal, 0.0, 0.3),
                     reference_attention(q, k, v2, causal, 0.3), 1e-12, 1e-10);
      }
}

TEST(Attention, CausalWithDifferentQueryAndKeyLengthsIsTopLeftAligned) {
  for (auto [Tq, Tk] : std::vector<std::pair<int64_t, int64_t>>{{3, 5}, {5, 3}}) {
    SCOPED_TRACE(::testing::Message() << "Tq " << Tq << ", Tk " << Tk);
    Tensor q = random_f64({2, Tq, 4}, 5), k = random_f64({2, Tk, 4}, 6), v = random_f64({2, Tk, 3}, 7);
    expect_close(ops::scaled_dot_product_attention(q, k, v, true), reference_attention(q, k, v, true, 0.5), 1e-12,
                 1e-10);
  }
  // Query 0 sees only key 0, whatever Tk is.
  Tensor q = random_f64({1, 2, 3}, 8), k = random_f64({1, 4, 3}, 9), v = random_f64({1, 4, 2}, 10);
  Tensor out = ops::scaled_dot_product_attention(q, k, v, true);
  expect_close(out.select(1, 0), v.select(1, 0), 1e-12, 1e-12);
}

TEST(Attention, FloatInputsMatchReference) {
  Tensor q = random_f64({2, 5, 4}, 11), k = random_f64({2, 5, 4}, 12), v = random_f64({2, 5, 4}, 13);
  Tensor out = ops::scaled_dot_product_attention(q.to(DType::f32), k.to(DType::f32), v.to(DType::f32), true);
  EXPECT_EQ(out.dtype(), DType::f32);
  expect_close(out, reference_attention(q, k, v, true, 0.5), 1e-5, 1e-5);
}

TEST(Attention, CausalOutputsIgnoreFutureKeysAndValues) {
  const int64_t T = 7, keep = 4;
  Tensor q = random_f64({2, 2, T, 3}, 14), k = random_f64({2, 2, T, 3}, 15), v = random_f64({2, 2, T, 3}, 16);
  Tensor out = ops::scaled_dot_product_attention(q, k, v, true);
  // Replace keys and values at positions >= keep; queries < keep must not change.
  Tensor k2 = ops::cat({k.narrow(2, 0, keep), random_f64({2, 2, T - keep, 3}, 17, -5, 5)}, 2);
  Tensor v2 = ops::cat({v.narrow(2, 0, keep), random_f64({2, 2, T - keep, 3}, 18, -5, 5)}, 2);
  Tensor out2 = ops::scaled_dot_product_attention(q, k2, v2, true);
  expect_close(out2.narrow(2, 0, keep), out.narrow(2, 0, keep), 1e-14, 0);
  // Later queries do see them (so the comparison above is not vacuous).
  std::vector<double> late = out.narrow(2, keep, T - keep).to_vector<double>();
  std::vector<double> late2 = out2.narrow(2, keep, T - keep).to_vector<double>();
  EXPECT_NE(late, late2);
  // And no gradient flows from early outputs to future keys and values.
  Tensor kg = k.detach().set_requires_grad(true), vg = v.detach().set_requires_grad(true);
  ops::sum(ops::scaled_dot_product_attention(q, kg, vg, true).narrow(2, 0, keep)).backward();
  for (Tensor grad : {kg.grad(), vg.grad()}) {
    std::vector<double> future = grad.narrow(2, keep, T - keep).to_vector<double>();
    for (double x : future) EXPECT_EQ(x, 0.0);
    std::vector<double> past = grad.narrow(2, 0, keep).to_vector<double>();
    EXPECT_NE(past, std::vector<double>(past.size(), 0.0));
  }
}

TEST(Attention, ZeroDropoutIsDeterministicAndDrawsNothing) {
  Tensor q = random_f64({2, 2, 5, 4}, 19), k = random_f64({2, 2, 5, 4}, 20), v = random_f64({2, 2, 5, 4}, 21);
  Generator gen(3);
  Tensor a = ops::scaled_dot_product_attention(q, k, v, true, 0.0, std::nullopt, &gen);
  Tensor b = ops::scaled_dot_product_attention(q, k, v, true, 0.0, std::nullopt, &gen);
  EXPECT_EQ(a.to_vector<double>(), b.to_vector<double>());
  EXPECT_EQ(gen.offset(), 0u);
  expect_close(a, reference_attention(q, k, v, true, 0.5), 1e-12, 1e-10);
}

TEST(Attention, DropoutActsOnTheAttentionWeights) {
  const double p = 0.4;
  Tensor q = random_f64({2, 2, 5, 3}, 22), k = random_f64({2, 2, 5, 3}, 23), v = random_f64({2, 2, 5, 3}, 24);
  const double scale = 1.0 / std::sqrt(3.0);
  Generator gen(9);
  Tensor out = ops::scaled_dot_product_attention(q, k, v, true, p, std::nullopt, &gen);
  // The same generator state, asked for a mask of the weights' shape, gives keep / (1 - p).
  Generator replay(9);
  std::vector<double> kept = ops::dropout(ones({2, 2, 5, 5}, DType::f64), p, true, &replay).to_vector<double>();
  std::vector<double> weights = reference_weights(q, k, true, scale);
  for (size_t i = 0; i < weights.size(); ++i) weights[i] *= kept[i];
  expect_close(out, reference_output(weights, q, v), 1e-12, 1e-10);
  EXPECT_EQ(gen.offset(), replay.offset());
  Tensor again = ops::scaled_dot_product_attention(q, k, v, true, p, std::nullopt, &gen);
  EXPECT_NE(again.to_vector<double>(), out.to_vector<double>()) << "the generator advances between calls";
}

TEST(Attention, GradientsMatchFiniteDifferences) {
  for (bool causal : {false, true}) {
    SCOPED_TRACE(::testing::Message() << "causal " << causal);
    Tensor q = random_f64({2, 2, 5, 3}, 25), k = random_f64({2, 2, 5, 3}, 26), v = random_f64({2, 2, 5, 4}, 27);
    expect_gradients_match(
        [causal](const std::vector<Tensor>& in) {
          return ops::scaled_dot_product_attention(in[0], in[1], in[2], causal);
        },
        {q, k, v});
    Tensor q2 = random_f64({3, 7, 4}, 28), k2 = random_f64({3, 5, 4}, 29), v2 = random_f64({3, 5, 3}, 30);
    expect_gradients_match(
        [causal](const std::vector<Tensor>& in) {
          return ops::scaled_dot_product_attention(in[0], in[1], in[2], causal, 0.0, 0.7);
        },
        {q2, k2, v2});
  }
  // With dropout: a fresh generator per call fixes the mask.
  Tensor q = random_f64({2, 5, 3}, 31), k = random_f64({2, 5, 3}, 32), v = random_f64({2, 5, 3}, 33);
  expect_gradients_match(
      [](const std::vector<Tensor>& in) {
        Generator gen(4);
        return ops::scaled_dot_product_attention(in[0], in[1], in[2], true, 0.3, std::nullopt, &gen);
      },
      {q, k, v});
}

TEST(Attention, BatchDimsBroadcast) {
  // One key/value head shared by 2 query heads.
  Tensor q = random_f64({2, 2, 5, 3}, 34), k = random_f64({2, 1, 5, 3}, 35), v = random_f64({2, 1, 5, 3}, 36);
  Tensor out = ops::scaled_dot_product_attention(q, k, v, true);
  ASSERT_EQ(out.shape(), Shape({2, 2, 5, 3}));
  Tensor expected = reference_attention(q, k.expand({2, 2, 5, 3}).contiguous(), v.expand({2, 2, 5, 3}).contiguous(),
                                        true, 1.0 / std::sqrt(3.0));
  expect_close(out, expected, 1e-12, 1e-10);
}

TEST(Attention, Errors) {
  Tensor q = zeros({2, 5, 4}), k = zeros({2, 6, 4}), v = zeros({2, 6, 3});
  EXPECT_NO_THROW(ops::scaled_dot_product_attention(q, k, v));
  EXPECT_EQ(error_of([&] {
              ops::scaled_dot_product_attention(q, zeros({2, 6, 3}), v);
            }),
            "scaled_dot_product_attention: query [2, 5, 4] and key [2, 6, 3] must have the same head size (last dim)");
  EXPECT_EQ(error_of([&] {
              ops::scaled_dot_product_attention(q, k, zeros({2, 5, 3}));
            }),
            "scaled_dot_product_attention: key [2, 6, 4] and value [2, 5, 3] must have the same number of positions "
            "(dim -2)");
  EXPECT_EQ(error_of([&] { ops::scaled_dot_product_attention(zeros({4}), k, v); }),
            "scaled_dot_product_attention: query, key and value must be [..., T, D], got query [4], key [2, 6, 4], "
            "value [2, 6, 3]");
  EXPECT_EQ(error_of([&] { ops::scaled_dot_product_attention(q, k.to(DType::f64), v); }),
            "scaled_dot_product_attention: query, key and value must have one dtype, got query float32[2, 5, 4] on "
            "cpu, key float64[2, 6, 4] on cpu, value float32[2, 6, 3] on cpu");
  EXPECT_EQ(error_of([&] {
              ops::scaled_dot_product_attention(zeros({3, 5, 4}), k, v);
            }),
            "scaled_dot_product_attention: the batch dims of query [3, 5, 4], key [2, 6, 4] and value [2, 6, 3] do "
            "not broadcast together");
  EXPECT_EQ(error_of([&] { ops::scaled_dot_product_attention(q, k, v, false, 1.5); }),
            "scaled_dot_product_attention: dropout_p must be in [0, 1], got 1.5");
  EXPECT_EQ(error_of([&] { ops::scaled_dot_product_attention(q, Tensor(), v); }),
            "scaled_dot_product_attention: key is an undefined tensor");
  EXPECT_EQ(error_of([&] {
              ops::scaled_dot_product_attention(zeros({2, 5, 4}, DType::i64), k, v);
            }),
            "scaled_dot_product_attention: query must be a floating tensor, got int64[2, 5, 4] on cpu");
}

TEST(Attention, FlashRunsOnlyOnCudaAndTheDispatchFallsBackToTheReference) {
  Tensor q = random_f64({1, 2, 5, 64}, 1), k = random_f64({1, 2, 5, 64}, 2), v = random_f64({1, 2, 5, 64}, 3);
  std::optional<std::string> why = ops::flash_attention_unsupported(q, k, v);
  ASSERT_TRUE(why.has_value());
  EXPECT_TRUE(why->find("CUDA") != std::string::npos) << *why;
  precis::testing::expect_error([&] { ops::flash_attention(q, k, v, true); }, "model.attention: reference");
  // AttentionImpl::flash (the default) on inputs flash cannot take is the reference itself.
  expect_close(
      ops::scaled_dot_product_attention(q, k, v, true),
      ops::scaled_dot_product_attention(q, k, v, true, 0.0, std::nullopt, nullptr, ops::AttentionImpl::reference), 0.0,
      0.0);
}
