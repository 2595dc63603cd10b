// flash_attention_packed on the CPU (ops/cpu/flash_attention.cpp) against the reference
// attention (matmul, softmax, matmul on the split heads) and central differences: causal and
// full, one key tile and several (T > 64 exercises the online softmax's rescaling).
#include <gtest/gtest.h>

#include "ops/ops.h"
#include "support/gradcheck.h"

using namespace precis;
using precis::testing::expect_close;
using precis::testing::expect_gradients_match;
using precis::testing::random_f64;

namespace {

// The reference attention of a packed qkv [B, T, 3C] with n_head heads, as [B, T, C].
Tensor reference_attention(const Tensor& qkv, int64_t n_head, bool causal) {
  const int64_t B = qkv.size(0), T = qkv.size(1), C = qkv.size(2) / 3;
  std::vector<Tensor> parts = ops::split(qkv, C, 2);
  auto heads = [&](const Tensor& t) { return t.view({B, T, n_head, C / n_head}).transpose(1, 2); };
  Tensor y = ops::scaled_dot_product_attention(heads(parts[0]), heads(parts[1]), heads(parts[2]), causal, 0.0,
                                               std::nullopt, nullptr, ops::AttentionImpl::reference);
  return y.transpose(1, 2).reshape({B, T, C});
}

struct Case {
  int64_t B, T, H, D;
  bool causal;
};
const Case kCases[] = {{2, 5, 2, 3, true}, {1, 7, 3, 4, false}, {2, 70, 2, 8, true}, {1, 130, 1, 16, false}};

}  // namespace

TEST(FlashAttentionCpu, RunsForF32AndF64Only) {
  EXPECT_FALSE(ops::flash_attention_packed_unsupported(zeros({1, 4, 6}, DType::f32), 2).has_value());
  EXPECT_FALSE(ops::flash_attention_packed_unsupported(zeros({1, 4, 6}, DType::f64), 2).has_value());
  EXPECT_TRUE(ops::flash_attention_packed_unsupported(zeros({1, 4, 6}, DType::bf16), 2).has_value());
}

TEST(FlashAttentionCpu, ForwardMatchesTheReference) {
  for (const Case& c : kCases) {
    const Tensor qkv = random_f64({c.B, c.T, 3 * c.H * c.D}, 1, -2, 2);
    expect_close(ops::flash_attention_packed(qkv, c.H, c.causal), reference_attention(qkv, c.H, c.causal), 1e-12,
                 1e-12);
    const Tensor qkv32 = qkv.to(DType::f32);
    expect_close(ops::flash_attention_packed(qkv32, c.H, c.causal), reference_attention(qkv32, c.H, c.causal), 1e-5,
                 1e-5);
  }
}

TEST(FlashAttentionCpu, GradientsMatchTheReferenceAndFiniteDifferences) {
  for (const Case& c : kCases) {
    const Tensor qkv = random_f64({c.B, c.T, 3 * c.H * c.D}, 2, -2, 2);
    const Tensor weights = random_f64({c.B, c.T, c.H * c.D}, 3);
    auto grad_of = [&](bool flash) {
      Tensor x = qkv.detach().set_requires_grad(true);
      Tensor y = flash ? ops::flash_attention_packed(x, c.H, c.causal) : reference_attention(x, c.H, c.causal);
      ops::sum(y * weights).backward();
      return x.grad();
    };
    expect_close(grad_of(true), grad_of(false), 1e-11, 1e-11);
  }
  auto fn = [](bool causal) {
    return [causal](const std::vector<Tensor>& in) { return ops::flash_attention_packed(in[0], 2, causal); };
  };
  expect_gradients_match(fn(true), {random_f64({2, 4, 12}, 4, -1, 1)});
  expect_gradients_match(fn(false), {random_f64({1, 5, 12}, 5, -1, 1)});
}

TEST(FlashAttentionCpu, QkvBiasGetsTheGradientOfTheProductThatAddedIt) {
  // qkv = x W^T + b with b's gradient left to the attention (linear on b detached, b handed to
  // flash_attention_packed) gives x, W and b the gradients of the plain composition, b's by the
  // same column sums, so the very same values; and finite differences agree.
  for (const Case& c : kCases) {
    const int64_t C = c.H * c.D, in = 5;
    for (DType dtype : {DType::f64, DType::f32}) {
      const Tensor x0 = random_f64({c.B, c.T, in}, 6).to(dtype), w0 = random_f64({3 * C, in}, 7, -1, 1).to(dtype),
                   b0 = random_f64({3 * C}, 8).to(dtype), weights = random_f64({c.B, c.T, C}, 9).to(dtype);
      auto grads_of = [&](bool folded) {
        Tensor x = x0.detach().set_requires_grad(true), w = w0.detach().set_requires_grad(true),
               b = b0.detach().set_requires_grad(true);
        Tensor y = folded ? ops::flash_attention_packed(ops::linear(x, w, b.detach()), c.H, c.causal, b)
                          : ops::flash_attention_packed(ops::linear(x, w, b), c.H, c.causal);
        ops::sum(y * weights).backward();
        return std::vector<Tensor>{x.grad(), w.grad(), b.grad()};
      };
      const std::vector<Tensor> folded = grads_of(true), plain = grads_of(false);
      for (size_t i = 0; i < 3; ++i) EXPECT_EQ(folded[i].to_vector<double>(), plain[i].to_vector<double>()) << i;
    }
  }
  auto fn = [](const std::vector<Tensor>& in) {
    return ops::flash_attention_packed(ops::linear(in[0], in[1], in[2].detach()), 2, true, in[2]);
  };
  expect_gradients_match(
      fn, {random_f64({2, 4, 3}, 10, -1, 1), random_f64({12, 3}, 11, -1, 1), random_f64({12}, 12, -1, 1)});
}

TEST(FlashAttentionCpu, QkvBiasMustMatchQkvsLastDim) {
  const Tensor qkv = random_f64({1, 4, 12}, 13);
  EXPECT_THROW(ops::flash_attention_packed(qkv, 2, true, random_f64({6}, 14)), Error);
}
