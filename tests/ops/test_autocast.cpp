#include <gtest/gtest.h>

#include "core/autograd.h"
#include "ops/autocast.h"
#include "ops/ops.h"
#include "support/gradcheck.h"

using namespace precis;
using precis::testing::expect_close;
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

TEST(Autocast, NoGradCastsAreNotCached) {
  ops::autocast::clear_cache();
  Tensor w = random_f64({5, 3}, 3).to(DType::f32).set_requires_grad();
  NoGradGuard no_grad;
  ops::autocast::Scope scope(DType::f16);
  EXPECT_EQ(ops::linear(random_f64({2, 3}, 1).to(DType::f32), w).dtype(), DType::f16);
  EXPECT_EQ(ops::autocast::cache_size(), 0u);
}
