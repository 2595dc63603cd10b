#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "core/autograd.h"
#include "core/copy.h"
#include "ops/ops.h"
#include "support/gradcheck.h"

using namespace precis;
using precis::testing::expect_close;

TEST(Autograd, DiamondGraphSumsBothPaths) {
  // y = a*b + a*c with b = 2a, c = 3a: dy/da = b + c + 2a*... computed: y = 2a^2 + 3a^2 = 5a^2, dy/da = 10a
  Tensor a = tensor({1.0, -2.0, 3.0}, DType::f64).set_requires_grad();
  Tensor b = a * 2.0, c = a * 3.0;
  Tensor y = ops::sum(a * b + a * c);
  y.backward();
  expect_close(a.grad(), tensor({10, -20, 30}, DType::f64));
}

TEST(Autograd, TensorUsedTwiceInOneOp) {
  Tensor x = tensor({3.0}, DType::f64).set_requires_grad();
  ops::sum(x * x).backward();
  EXPECT_DOUBLE_EQ(x.grad().item(), 6.0);
}

TEST(Autograd, GradientsAccumulateAcrossBackwardCalls) {
  Tensor x = tensor({1.0, 2.0}, DType::f64).set_requires_grad();
  ops::sum(x * 3.0).backward();
  ops::sum(x * x).backward();
  expect_close(x.grad(), tensor({3 + 2, 3 + 4}, DType::f64));
  x.zero_grad();
  EXPECT_FALSE(x.grad().defined());
}

TEST(Autograd, NoGradRecordsNothing) {
  Tensor x = tensor({1.0}).set_requires_grad();
  Tensor y;
  {
    NoGradGuard guard;
    y = x * 2.0;
  }
  EXPECT_FALSE(y.requires_grad());
  EXPECT_EQ(y.grad_fn(), nullptr);
  EXPECT_TRUE(grad_mode_enabled());
  EXPECT_TRUE((x * 2.0).requires_grad());
}

TEST(Autograd, RequiresGradPropagatesAndDetachCuts) {
  Tensor x = tensor({1.0}).set_requires_grad();
  Tensor c = tensor({2.0});
  EXPECT_TRUE((x + c).requires_grad());
  EXPECT_FALSE((c + c).requires_grad());
  Tensor d = (x * 2.0).detach();
  EXPECT_FALSE(d.requires_grad());
  EXPECT_TRUE(d.is_leaf());
  EXPECT_EQ(d.raw_data(), d.raw_data());
}

TEST(Autograd, RetainGraphAllowsASecondBackward) {
  Tensor x = tensor({2.0}, DType::f64).set_requires_grad();
  Tensor y = ops::sum(ops::exp(x) * x);
  y.backward(Tensor(), /*retain_graph=*/true);
  y.backward();
  // d/dx (x e^x) = e^x (1 + x), twice
  EXPECT_NEAR(x.grad().item(), 2 * std::exp(2.0) * 3.0, 1e-9);
  try {
    y.backward();
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("retain_graph=true"), std::string::npos) << e.what();
  }
}

TEST(Autograd, GradReadyHooksFireOnceInOrderGradientsBecomeFinal) {
  // w1 is used first in forward, so its gradient is final last.
  Tensor w1 = tensor({1.0}).set_requires_grad(), w2 = tensor({2.0}).set_requires_grad();
  std::vector<std::string> fired;
  std::vector<double> seen;
  w1.register_grad_ready_hook([&](const Tensor& g) {
    fired.push_back("w1");
    seen.push_back(g.item());
  });
  w2.register_grad_ready_hook([&](const Tensor& g) {
    fired.push_back("w2");
    seen.push_back(g.item());
  });
  Tensor h = w1 * 3.0;
  Tensor y = ops::sum(h * w2 + h * w2);  // w2 used twice: its hook still fires once
  y.backward();
  EXPECT_EQ(fired, (std::vector<std::string>{"w2", "w1"}));
  EXPECT_DOUBLE_EQ(seen[0], 2 * 3.0);      // dy/dw2 = 2h = 6
  EXPECT_DOUBLE_EQ(seen[1], 2 * 2.0 * 3);  // dy/dw1 = 2 * w2 * 3 = 12
}

TEST(Autograd, ALeafCastBeforeTheForwardGetsItsGradientWhenItIsFinalNotLast) {
  // As autocast's precache: w's cast (a pass-through node, and with it w's AccumulateGrad) is
  // made before the forward, so both are older than every node of it. w is used last, so its
  // gradient is final first; its hook must fire then, not after the rest of the backward.
  Tensor w = tensor({2.0}).set_requires_grad(), x = tensor({1.0}).set_requires_grad();
  Tensor w_cast;
  {
    NoGradGuard no_grad;
    w_cast = w.clone();
  }
  autograd::record_pass_through("to", w, w_cast);
  std::vector<std::string> fired;
  w.register_grad_ready_hook([&](const Tensor&) { fired.push_back("w"); });
  x.register_grad_ready_hook([&](const Tensor&) { fired.push_back("x"); });
  Tensor h = (x * 3.0) * 5.0;
  ops::sum(h * w_cast).backward();
  EXPECT_EQ(fired, (std::vector<std::string>{"w", "x"}));
  EXPECT_DOUBLE_EQ(w.grad().item(), 15.0);
  EXPECT_DOUBLE_EQ(x.grad().item(), 30.0);
}

TEST(Autograd, SavedTensorsAreFreedAfterBackward) {
  Tensor x = rand({256, 1024}).set_requires_grad();  // 1 MiB
  Tensor y = ops::sum(ops::exp(ops::exp(ops::exp(x))));
  size_t with_graph = cpu_allocator().stats().allocated_bytes;
  y.backward();
  size_t after = cpu_allocator().stats().allocated_bytes;
  // The three exp outputs (1 MiB each) were saved; the graph (y) is still alive,
  // but backward freed them. What remains new is x.grad (1 MiB).
  EXPECT_LE(after + 2 * (1 << 20), with_graph) << "with graph " << with_graph << ", after " << after;
}

TEST(Autograd, NonScalarBackwardNeedsAGradient) {
  Tensor x = tensor({1.0, 2.0}).set_requires_grad();
  Tensor y = x * 2.0;
  EXPECT_THROW(y.backward(), Error);
  y.backward(tensor({1.0, 10.0}));
  expect_close(x.grad(), tensor({2, 20}));
  EXPECT_THROW(tensor({1.0}).backward(), Error);
}

// A leaf's cast hands its gradient to the leaf in the cast's dtype; AccumulateGrad widens it
// as it adds, and gradients summed for one leaf take the wider dtype: an f32 gradient of
// 1 + 2^-12 plus a bf16 one of 1 is 2 + 2^-12 in f32 (bf16 would round it to 2).
TEST(Autograd, CastGradientsReachTheLeafWithoutLosingBits) {
  const double tiny = std::ldexp(1.0, -12);
  Tensor x = tensor({1.0, 2.0}, DType::f32).set_requires_grad();
  Tensor w = tensor({1.0 + tiny, 3.0 + 2 * tiny}, DType::f32);
  for (int order = 0; order < 2; ++order) {  // either gradient may reach the leaf first
    x.zero_grad();
    Tensor direct, through_cast;
    if (order == 0) {
      direct = ops::sum(x * w);
      through_cast = ops::sum(x.to(DType::bf16));
    } else {
      through_cast = ops::sum(x.to(DType::bf16));
      direct = ops::sum(x * w);
    }
    (direct + through_cast.to(DType::f32)).backward();
    ASSERT_EQ(x.grad().dtype(), DType::f32);
    expect_close(x.grad(), tensor({2.0 + tiny, 4.0 + 2 * tiny}, DType::f32), 0, 0);
  }
  // Only through the cast, twice (two backward calls): widened into the f32 .grad both times.
  x.zero_grad();
  ops::sum(x.to(DType::bf16) * 3.0).backward();
  ops::sum(x.to(DType::bf16) * 3.0).backward();
  ASSERT_EQ(x.grad().dtype(), DType::f32);
  expect_close(x.grad(), tensor({6.0, 6.0}, DType::f32), 0, 0);
}

// Gradients meeting at one input are summed in place only into a gradient nothing else holds:
// the gradient given to backward(), which the add node hands to both branches, stays as it was.
TEST(Autograd, SummingGradientsNeverWritesIntoAHeldTensor) {
  Tensor x = tensor({1.0, 2.0, 3.0}, DType::f64).set_requires_grad();
  Tensor given = tensor({1.0, 10.0, 100.0}, DType::f64);
  (x * 2.0 + x * 3.0 + x).backward(given);
  expect_close(x.grad(), tensor({6.0, 60.0, 600.0}, DType::f64), 0, 0);
  expect_close(given, tensor({1.0, 10.0, 100.0}, DType::f64), 0, 0);
  // A branch whose gradient is the given tensor itself, met by another: the sum is new.
  Tensor y = tensor({4.0}, DType::f64).set_requires_grad();
  Tensor g = tensor({0.5}, DType::f64);
  (y + y * 4.0).backward(g);
  expect_close(y.grad(), tensor({2.5}, DType::f64), 0, 0);
  expect_close(g, tensor({0.5}, DType::f64), 0, 0);
}

// An op that passes x through and hands its gradient back as it came, showing it to `seen`.
Tensor pass_through(const Tensor& x, std::function<void(const Tensor&)> seen = {}) {
  Tensor y = x.detach();
  autograd::record("pass_through", {x}, {y}, [seen](const BackwardArgs& g) {
    if (seen) seen(g.grad());
    return std::vector<Tensor>{g.grad()};
  });
  return y;
}

// Two gradients of a channels-last tensor are summed into a channels-last tensor (as
// PyTorch's preserve_format does), so that the sum and the next op need no transposing copy.
TEST(Autograd, GradientsMeetingInAChannelsLastLayoutKeepIt) {
  const Shape shape{2, 3, 4, 5}, channels_last{60, 1, 15, 3};
  Tensor x = randn(shape, DType::f64).set_requires_grad();
  Tensor given = empty(shape, DType::f64).as_strided(shape, channels_last, 0);
  copy_(given, randn(shape, DType::f64));
  Tensor seen;
  Tensor y = pass_through(x, [&](const Tensor& g) { seen = g; });
  (pass_through(y) + pass_through(y)).backward(given);
  ASSERT_TRUE(seen.defined());
  EXPECT_EQ(seen.strides(), channels_last);
  expect_close(seen, given * 2.0, 0, 0);
  expect_close(x.grad(), given * 2.0, 0, 0);
}
