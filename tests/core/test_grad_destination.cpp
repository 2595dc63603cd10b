// Gradients written by a backward function straight into a leaf's .grad
// (BackwardArgs::take_grad_destination, core/autograd.h), checked on the CPU against the
// path every other op takes: the gradient returned, then copied or added into .grad by
// AccumulateGrad. The test op is y = x * w (elementwise) whose backward writes dw into w's
// .grad where the engine offers it; the same op with `direct` off is the reference.
#include <gtest/gtest.h>

#include <string>

#include "core/autograd.h"
#include "core/copy.h"
#include "ops/ops.h"
#include "support/gradcheck.h"

using namespace precis;
using precis::testing::expect_close;
using precis::testing::random_f64;

namespace {

// How often the test op's backward wrote dw into .grad, and how often it returned it.
struct Counts {
  int written = 0;
  int returned = 0;
};

// y = x * w; dx = g * w, dw = g * x. With `direct`, dw goes into w's .grad when offered.
Tensor product(const Tensor& x, const Tensor& w, bool direct, Counts* counts) {
  Tensor y;
  {
    NoGradGuard no_grad;
    y = ops::mul(x, w);
  }
  autograd::record("test_product", {x, w}, {y},
                   [x = x.detach(), w = w.detach(), direct, counts](const BackwardArgs& g) {
                     Tensor dx, dw;
                     if (g.needs(0)) dx = ops::mul(g.grad(), w);
                     if (g.needs(1)) {
                       const Tensor values = ops::mul(g.grad(), x);
                       const GradDestination to = direct ? g.take_grad_destination(1, DType::f32) : GradDestination{};
                       if (to) {
                         if (to.accumulate)
                           accumulate_(to.grad, values);
                         else
                           copy_(to.grad, values);
                         ++counts->written;
                       } else {
                         dw = values;
                         ++counts->returned;
                       }
                     }
                     return std::vector<Tensor>{dx, dw};
                   });
  return y;
}

// `w` seen through a pass-through node, as autocast's cached weight casts are.
Tensor passed_through(const Tensor& w) {
  Tensor out;
  {
    NoGradGuard no_grad;
    out = w.clone();
  }
  autograd::record_pass_through("to", w, out);
  return out;
}

Tensor values(const Shape& shape, uint64_t seed) { return random_f64(shape, seed).to(DType::f32); }

// A leaf whose .grad is a dense f32 tensor holding `fill` (a flat buffer's view, say).
Tensor leaf_with_grad(const Tensor& values, double fill, bool stale) {
  Tensor w = values.clone().set_requires_grad();
  w.set_grad(full(values.shape(), fill));
  w.impl()->grad_is_stale = stale;
  return w;
}

const Shape kShape = {3, 5};

}  // namespace

TEST(GradDestination, OverwritesAStaleGradAndAddsToAnother) {
  const Tensor x = values(kShape, 1), w0 = values(kShape, 2), c = values(kShape, 3);
  // The reference: the copy path into a fresh .grad.
  Counts ref_counts;
  Tensor ref = w0.clone().set_requires_grad();
  ops::sum(product(x, ref, false, &ref_counts) * c).backward();
  EXPECT_EQ(ref_counts.returned, 1);

  Counts counts;
  Tensor w = leaf_with_grad(w0, 7.0, /*stale=*/true);
  const void* grad_data = w.grad().raw_data();
  ops::sum(product(x, w, true, &counts) * c).backward();
  EXPECT_EQ(counts.written, 1);
  EXPECT_EQ(counts.returned, 0);
  EXPECT_FALSE(w.impl()->grad_is_stale);
  EXPECT_EQ(w.grad().raw_data(), grad_data) << ".grad is written where it lies";
  expect_close(w.grad(), ref.grad(), 0, 0);  // the stale 7s do not show through

  // Not stale: added.
  ops::sum(product(x, w, true, &counts) * c).backward();
  EXPECT_EQ(counts.written, 2);
  expect_close(w.grad(), ops::mul(ref.grad(), 2.0), 0, 0);

  // A .grad holding values and not stale: added to them, as AccumulateGrad adds.
  Tensor held = leaf_with_grad(w0, 0.5, /*stale=*/false);
  ops::sum(product(x, held, true, &counts) * c).backward();
  expect_close(held.grad(), ops::add(ref.grad(), 0.5), 1e-7, 1e-6);
}

TEST(GradDestination, ThroughPassThroughNodesOnly) {
  const Tensor x = values(kShape, 4), w0 = values(kShape, 5);
  Counts counts;
  Tensor w = leaf_with_grad(w0, 7.0, true);
  // Two pass-throughs in a row lead to the leaf.
  ops::sum(product(x, passed_through(passed_through(w)), true, &counts)).backward();
  EXPECT_EQ(counts.written, 1);
  expect_close(w.grad(), x, 0, 0);

  // A cast that is not a pass-through node (Tensor::to) is not looked through.
  Counts cast_counts;
  Tensor v = leaf_with_grad(w0, 7.0, true);
  ops::sum(product(x.to(DType::f64), v.to(DType::f64), true, &cast_counts)).backward();
  EXPECT_EQ(cast_counts.written, 0);
  EXPECT_EQ(cast_counts.returned, 1);
  expect_close(v.grad(), x, 0, 0);
}

TEST(GradDestination, GradReadyHooksFireOnceWithTheFinalGradient) {
  const Tensor x = values(kShape, 6), w0 = values(kShape, 7);
  // Every gradient of w written directly: the pass-through node receives none, and the
  // hook still fires, once.
  Tensor w = leaf_with_grad(w0, 7.0, true);
  std::vector<Tensor> seen;
  w.register_grad_ready_hook([&](const Tensor& g) { seen.push_back(g.clone()); });
  Counts counts;
  ops::sum(product(x, passed_through(w), true, &counts)).backward();
  EXPECT_EQ(counts.written, 1);
  ASSERT_EQ(seen.size(), 1u);
  expect_close(seen[0], x, 0, 0);

  // Tied: two direct writers and an op that returns its gradient. One hook call, after all
  // of them, with the sum.
  seen.clear();
  w.impl()->grad_is_stale = true;
  Tensor y = ops::sum(product(x, w, true, &counts)) + ops::sum(product(x, passed_through(w), true, &counts)) +
             ops::sum(ops::mul(w, 3.0));
  y.backward();
  EXPECT_EQ(counts.written, 3);
  ASSERT_EQ(seen.size(), 1u);
  expect_close(seen[0], ops::add(ops::mul(x, 2.0), 3.0), 1e-7, 1e-6);
  expect_close(w.grad(), seen[0], 0, 0);
}

TEST(GradDestination, TiedWeightsGetTheCopyPathsGradient) {
  const Tensor x1 = values(kShape, 8), x2 = values(kShape, 9), w0 = values(kShape, 10), c = values(kShape, 11);
  // w reaches the loss four ways: two direct writers (one through a pass-through), the
  // copy-path op, and a plain elementwise op; in both orders of the ops' creation.
  auto loss = [&](const Tensor& w, bool direct, Counts* counts, bool reversed) {
    Tensor a = ops::sum(product(x1, w, direct, counts) * c);
    Tensor b = ops::sum(product(x2, passed_through(w), direct, counts));
    Tensor d = ops::sum(product(x2, w, false, counts) * x1);
    Tensor e = ops::sum(ops::mul(w, w));
    return reversed ? e + d + b + a : a + b + d + e;
  };
  for (bool reversed : {false, true}) {
    for (bool stale : {true, false}) {
      const std::string what = std::string(reversed ? "reversed" : "in order") + (stale ? ", stale" : ", held");
      Counts ref_counts, counts;
      Tensor ref = leaf_with_grad(w0, 0.25, stale), w = leaf_with_grad(w0, 0.25, stale);
      loss(ref, false, &ref_counts, reversed).backward();
      loss(w, true, &counts, reversed).backward();
      EXPECT_EQ(ref_counts.written, 0) << what;
      EXPECT_EQ(counts.written, 2) << what;
      EXPECT_EQ(counts.returned, 1) << what;
      expect_close(w.grad(), ref.grad(), 1e-6, 1e-6);
      EXPECT_FALSE(w.impl()->grad_is_stale);
    }
  }
}

TEST(GradDestination, FallsBackWhereNoGradIsOffered) {
  const Tensor x = values(kShape, 12), w0 = values(kShape, 13);
  auto expect_returned = [&](const Tensor& w_in, const Tensor& leaf, const std::string& what) {
    Counts counts;
    ops::sum(product(x, w_in, true, &counts)).backward();
    EXPECT_EQ(counts.written, 0) << what;
    EXPECT_EQ(counts.returned, 1) << what;
    if (leaf.defined()) expect_close(leaf.grad().to(DType::f32).contiguous(), x, 0, 0);
  };
  // Not a leaf.
  Tensor w = leaf_with_grad(w0, 0.0, true);
  expect_returned(ops::mul(w, 1.0), w, "non-leaf");
  // A leaf without .grad: AccumulateGrad makes one.
  Tensor fresh = w0.clone().set_requires_grad();
  expect_returned(fresh, fresh, "no .grad");
  // A .grad of another dtype than the op writes, or not dense.
  Tensor wide = w0.clone().set_requires_grad();
  wide.set_grad(zeros(kShape, DType::f64));
  wide.impl()->grad_is_stale = true;
  expect_returned(wide, wide, "f64 .grad");
  Tensor strided = w0.clone().set_requires_grad();
  strided.set_grad(zeros({kShape[1], kShape[0]}).t());
  strided.impl()->grad_is_stale = true;
  expect_returned(strided, strided, "transposed .grad");
  // A leaf that is gone (only its AccumulateGrad's weak reference is left): nothing to write.
  Counts counts;
  Tensor xg = x.clone().set_requires_grad();
  Tensor y;
  {
    Tensor gone = leaf_with_grad(w0, 0.0, true);
    y = ops::sum(product(xg, gone, true, &counts));
  }
  y.backward();
  EXPECT_EQ(counts.written, 0);
  expect_close(xg.grad(), w0, 0, 0);
  // An input that needs no gradient is not offered.
  Tensor constant = w0.clone();
  constant.set_grad(zeros(kShape));
  Counts none;
  ops::sum(product(xg, constant, true, &none)).backward();
  EXPECT_EQ(none.written + none.returned, 0);
}

TEST(GradDestination, RetainGraphWritesInEachBackward) {
  const Tensor x = values(kShape, 14), w0 = values(kShape, 15);
  Counts counts;
  Tensor w = leaf_with_grad(w0, 7.0, true);
  int hooks = 0;
  w.register_grad_ready_hook([&](const Tensor&) { ++hooks; });
  Tensor y = ops::sum(product(x, passed_through(w), true, &counts) * x);
  y.backward(Tensor(), /*retain_graph=*/true);
  y.backward();
  EXPECT_EQ(counts.written, 2);
  EXPECT_EQ(hooks, 2);
  expect_close(w.grad(), ops::mul(ops::mul(x, x), 2.0), 1e-7, 1e-6);
}

TEST(GradDestination, MicroBatchesAddAfterOneLazyZeroGrad) {
  const Tensor x1 = values(kShape, 16), x2 = values(kShape, 17), w0 = values(kShape, 18);
  // As the trainer runs: .grad marked stale once, then one backward per micro-batch through
  // the same cached pass-through node.
  Tensor w = leaf_with_grad(w0, 7.0, true), ref = leaf_with_grad(w0, 7.0, true);
  const Tensor cast = passed_through(w), ref_cast = passed_through(ref);
  Counts counts, ref_counts;
  for (const Tensor& xs : {x1, x2}) {
    ops::sum(product(xs, cast, true, &counts)).backward();
    ops::sum(product(xs, ref_cast, false, &ref_counts)).backward();
  }
  EXPECT_EQ(counts.written, 2);
  expect_close(w.grad(), ops::add(x1, x2), 0, 0);
  expect_close(w.grad(), ref.grad(), 0, 0);
}

TEST(GradDestination, WritingAndReturningIsAnError) {
  Tensor w = leaf_with_grad(values(kShape, 19), 0.0, true);
  Tensor y;
  {
    NoGradGuard no_grad;
    y = w.clone();
  }
  autograd::record("writes_and_returns", {w}, {y}, [](const BackwardArgs& g) {
    const GradDestination to = g.take_grad_destination(0, DType::f32);
    copy_(to.grad, g.grad());
    return std::vector<Tensor>{g.grad()};
  });
  try {
    ops::sum(y).backward();
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("both wrote"), std::string::npos) << e.what();
  }
}

// An input that is not a leaf takes the gradient its other uses have gathered so far, when
// nothing else holds it (a residual block's input under cuDNN's beta = 1): the writer adds to
// it. x reaches the loss through h = 2 x twice, by the writer and by another op. The use created
// last runs first: if it is h * c, its fresh product is held when the writer runs and is taken;
// if it is the writer, nothing is held yet and it returns its gradient. A held gradient that is
// also referenced elsewhere (the seed given to backward, which an add passes through) is not
// offered.
TEST(GradDestination, ANonLeafTakesTheGradientItsOtherUsesGathered) {
  const Tensor x0 = values(kShape, 20), x1 = values(kShape, 21), c = values(kShape, 22), seed = values(kShape, 23);
  for (int order = 0; order < 3; ++order) {
    Counts counts;
    Tensor x = x0.clone().set_requires_grad();
    Tensor h = ops::mul(x, 2.0);
    if (order == 0) {
      Tensor written = ops::sum(product(x1, h, true, &counts));
      (written + ops::sum(ops::mul(h, c))).backward();
    } else if (order == 1) {
      Tensor other = ops::sum(ops::mul(h, c));
      (other + ops::sum(product(x1, h, true, &counts))).backward();
    } else {
      ops::add(product(x1, h, true, &counts), h).backward(seed);
    }
    const Tensor expected = order == 2 ? (seed * x1 + seed) * 2.0 : (c + x1) * 2.0;
    expect_close(x.grad(), expected, 1e-6, 1e-6);
    EXPECT_EQ(counts.written, order == 0 ? 1 : 0) << "order " << order;
    EXPECT_EQ(counts.returned, order == 0 ? 0 : 1) << "order " << order;
  }
}
