#include <gtest/gtest.h>

#include "core/autograd.h"
#include "ops/autocast.h"
#include "ops/ops.h"
#include "support/errors.h"
#include "support/gradcheck.h"

using namespace precis;
using precis::testing::expect_close;
using precis::testing::expect_error;
using precis::testing::random_f64;

TEST(Autocast, OutputDtypesFollowPyTorchLists) {
  Tensor x = random_f64({4, 8}, 1).to(DType::f32), w = random_f64({6, 8}, 2).to(DType::f32);
  Tensor lw = ones({8}), lb = zeros({8});
  Tensor targets = arange(0, 4, 1, DType::i64);
  for (DType compute : {DType::bf16, DType::f16}) {
    ops::autocast::Scope scope(compute);
    Tensor y = ops::linear(x, w);
    EXPECT_EQ(y.dtype(), compute) << "linear runs in the compute dtype";
    EXPECT_EQ(ops::matmul(x, w.t()).dtype(), compute);
    EXPECT_EQ(ops::scaled_dot_product_attention(x.view({1, 4, 8}), x.view({1, 4, 8}), x.view({1, 4, 8}), true).dtype(),
              compute);
    EXPECT_EQ(ops::softmax(y, -1).dtype(), DType::f32) << "softmax runs in f32";
    EXPECT_EQ(ops::log_softmax(y, -1).dtype(), DType::f32);
    EXPECT_EQ(ops::layer_norm(y.to(compute).view({6, 4}).t(), Tensor(), Tensor()).dtype(), DType::f32);
    EXPECT_EQ(ops::sum(y).dtype(), DType::f32) << "reductions run in f32";
    EXPECT_EQ(ops::mean(y, {0}).dtype(), DType::f32);
    EXPECT_EQ(ops::exp(y).dtype(), DType::f32);
    EXPECT_EQ(ops::log(ops::exp(y)).dtype(), DType::f32);
    EXPECT_EQ(ops::gelu(y).dtype(), compute) << "other elementwise ops keep their input dtype";
    EXPECT_EQ((y + x.slice(1, 0, 6)).dtype(), DType::f32) << "mixed inputs promote";
    EXPECT_EQ(ops::cross_entropy(y, targets).dtype(), DType::f32);
  }
  EXPECT_FALSE(ops::autocast::enabled()) << "the scope restores the previous state";
  EXPECT_EQ(ops::linear(x, w).dtype(), DType::f32);
}

TEST(Autocast, WeightCastIsCachedAndSharedByMicroBatches) {
  ops::autocast::clear_cache();
  Tensor w = random_f64({5, 3}, 3).to(DType::f32).set_requires_grad();
  Tensor x1 = random_f64({2, 3}, 4).to(DType::f32), x2 = random_f64({2, 3}, 5).to(DType::f32);
  Tensor grad_autocast;
  {
    ops::autocast::Scope scope(DType::bf16);
    // Two micro-batches, each with its own backward, through one cached cast.
    ops::sum(ops::linear(x1, w)).backward();
    EXPECT_EQ(ops::autocast::cache_size(), 1u);
    ops::sum(ops::linear(x2, w)).backward();
    EXPECT_EQ(ops::autocast::cache_size(), 1u);
  }
  EXPECT_EQ(w.grad().dtype(), DType::f32) << "gradients accumulate in f32";
  grad_autocast = w.grad().clone();
  // The f32 reference: d/dW sum(x W^T) = sum over rows of x, for every output row.
  Tensor w32 = w.detach().clone().set_requires_grad();
  ops::sum(ops::linear(x1, w32)).backward();
  ops::sum(ops::linear(x2, w32)).backward();
  expect_close(grad_autocast, w32.grad(), 2e-2, 2e-2);
  ops::autocast::clear_cache();
  EXPECT_EQ(ops::autocast::cache_size(), 0u);
}

// A cached weight cast passes its gradient through to the leaf unchanged (a product may
// write the weight's gradient into its .grad through it); an uncached cast does not.
TEST(Autocast, CachedWeightCastsArePassThroughNodes) {
  ops::autocast::clear_cache();
  Tensor w = random_f64({5, 3}, 3).to(DType::f32).set_requires_grad();
  Tensor x = random_f64({2, 3}, 4).to(DType::f32).set_requires_grad();
  ops::autocast::Scope scope(DType::bf16);
  Tensor w_cast = ops::autocast::to_compute(w), x_cast = ops::autocast::to_compute(x * 1.0);
  ASSERT_TRUE(w_cast.grad_fn() && x_cast.grad_fn());
  EXPECT_TRUE(w_cast.grad_fn()->passes_gradient_through());
  EXPECT_FALSE(x_cast.grad_fn()->passes_gradient_through());
  ops::sum(w_cast * 2.0).backward();
  EXPECT_EQ(w.grad().dtype(), DType::f32);
  expect_close(w.grad(), full({5, 3}, 2.0), 0, 0);
  ops::autocast::clear_cache();
}

TEST(Autocast, NoGradCastsAreNotCached) {
  ops::autocast::clear_cache();
  Tensor w = random_f64({5, 3}, 3).to(DType::f32).set_requires_grad();
  NoGradGuard no_grad;
  ops::autocast::Scope scope(DType::f16);
  EXPECT_EQ(ops::linear(random_f64({2, 3}, 1).to(DType::f32), w).dtype(), DType::f16);
  EXPECT_EQ(ops::autocast::cache_size(), 0u);
}

// precache: the casts of a flat buffer's leaves made by one cast of the whole buffer give the
// same values, outputs and f32 gradients as casting each leaf on first use, and to_compute
// returns them from the cache.
TEST(Autocast, PrecachedCastsOfAFlatBufferMatchPerWeightCasts) {
  Tensor buffer = random_f64({5 * 3 + 5 + 7}, 11).to(DType::f32);
  Tensor x = random_f64({4, 3}, 12).to(DType::f32);
  auto leaves_of = [](const Tensor& storage) {
    NoGradGuard no_grad;
    Tensor w = storage.narrow(0, 0, 15).view({5, 3}), b = storage.narrow(0, 15, 5), unused = storage.narrow(0, 20, 7);
    return std::vector<Tensor>{w.set_requires_grad(), b.set_requires_grad(), unused.set_requires_grad()};
  };
  auto loss_of = [&](const std::vector<Tensor>& p) { return ops::sum(ops::gelu(ops::linear(x, p[0], p[1]))); };

  ops::autocast::clear_cache();
  std::vector<Tensor> plain = leaves_of(buffer.clone());
  Tensor plain_loss;
  {
    ops::autocast::Scope scope(DType::bf16);
    plain_loss = loss_of(plain);
    plain_loss.backward();
  }
  ops::autocast::clear_cache();
  Tensor flat = buffer.clone();
  std::vector<Tensor> cached = leaves_of(flat);
  ops::autocast::precache(flat, cached, DType::bf16);
  EXPECT_EQ(ops::autocast::cache_size(), 3u);
  Tensor cached_loss;
  {
    ops::autocast::Scope scope(DType::bf16);
    Tensor w_cast = ops::autocast::to_compute(cached[0]);
    EXPECT_EQ(w_cast.dtype(), DType::bf16);
    EXPECT_TRUE(w_cast.same(ops::autocast::to_compute(cached[0]))) << "served from the cache";
    ASSERT_TRUE(w_cast.grad_fn());
    EXPECT_TRUE(w_cast.grad_fn()->passes_gradient_through()) << "a product may write through it into .grad";
    expect_close(w_cast, cached[0].detach().to(DType::bf16), 0, 0);
    cached_loss = loss_of(cached);
    cached_loss.backward();
  }
  EXPECT_EQ(ops::autocast::cache_size(), 3u) << "nothing cast again";
  expect_close(cached_loss, plain_loss, 0, 0);
  for (size_t i = 0; i < 2; ++i) {
    ASSERT_EQ(cached[i].grad().dtype(), DType::f32);
    expect_close(cached[i].grad(), plain[i].grad(), 0, 0);
  }
  EXPECT_FALSE(cached[2].grad().defined()) << "a leaf the loss does not use gets no gradient";
  ops::autocast::clear_cache();
}

// precache takes a leaf laid out channels-last in the buffer (nn::to_channels_last): its cast is
// the same elements of the cast buffer read with the leaf's strides, so it is channels-last too
// and equals the leaf's own cast element by element. A view with gaps is still refused.
TEST(Autocast, PrecacheKeepsAChannelsLastLeafsLayout) {
  const Shape shape{4, 3, 3, 3}, channels_last{27, 1, 9, 3};
  Tensor buffer = random_f64({2 + 4 * 27}, 13).to(DType::f32);
  Tensor leaf;
  {
    NoGradGuard no_grad;
    leaf = buffer.as_strided(shape, channels_last, 2).set_requires_grad();
  }
  ops::autocast::clear_cache();
  ops::autocast::precache(buffer, {leaf}, DType::bf16);
  {
    ops::autocast::Scope scope(DType::bf16);
    const Tensor cast = ops::autocast::to_compute(leaf);
    EXPECT_EQ(cast.dtype(), DType::bf16);
    EXPECT_EQ(cast.strides(), channels_last);
    expect_close(cast, leaf.detach().to(DType::bf16), 0, 0);
  }
  ops::autocast::clear_cache();
  Tensor gappy;
  {
    NoGradGuard no_grad;
    gappy = buffer.as_strided({4, 3}, {6, 1}, 0).set_requires_grad();
  }
  expect_error([&] { ops::autocast::precache(buffer, {gappy}, DType::bf16); },
               "every leaf must be a dense view of the buffer that requires grad");
  ops::autocast::clear_cache();
}
