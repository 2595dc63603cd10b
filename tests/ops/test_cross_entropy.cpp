#include <gtest/gtest.h>

#include <cmath>

#include "ops/ops.h"
#include "support/errors.h"
#include "support/gradcheck.h"

using namespace precis;
using precis::testing::expect_close;
using precis::testing::expect_error;
using precis::testing::expect_gradients_match;
using precis::testing::random_f64;

namespace {

Tensor targets_of(const std::vector<int64_t>& values, const Shape& shape, DType dtype = DType::i64) {
  return from_vector(values, shape).to(dtype);
}

// Mean over non-ignored rows of logsumexp(row) - row[target], in double: the reference.
double reference_cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index = -100) {
  const int64_t C = logits.shape().back();
  std::vector<double> x = logits.to_vector<double>();
  std::vector<int64_t> t = targets.to_vector<int64_t>();
  double total = 0;
  int64_t valid = 0;
  for (size_t r = 0; r < t.size(); ++r) {
    if (t[r] == ignore_index) continue;
    double m = -INFINITY, s = 0;
    for (int64_t j = 0; j < C; ++j) m = std::max(m, x[r * C + j]);
    for (int64_t j = 0; j < C; ++j) s += std::exp(x[r * C + j] - m);
    total += m + std::log(s) - x[r * C + t[r]];
    ++valid;
  }
  return total / static_cast<double>(valid);
}

}  // namespace

TEST(CrossEntropy, HandComputedValues) {
  Tensor loss = ops::cross_entropy(tensor({0, 0}).reshape({1, 2}), targets_of({0}, {1}));
  EXPECT_EQ(loss.shape(), Shape{});
  EXPECT_EQ(loss.dtype(), DType::f32);
  EXPECT_NEAR(loss.item(), std::log(2.0), 1e-7);
  // logsumexp(1, 2, 3) - 3 and logsumexp(1, 2, 3) - 1, averaged.
  Tensor logits = tensor({1, 2, 3, 1, 2, 3}, DType::f64).reshape({2, 3});
  EXPECT_NEAR(ops::cross_entropy(logits, targets_of({2, 0}, {2})).item(), (0.40760596444438 + 2.40760596444438) / 2,
              1e-12);
  // Logits [C] with a scalar target.
  EXPECT_NEAR(ops::cross_entropy(tensor({1, 2, 3}, DType::f64), targets_of({1}, {})).item(), 1.40760596444438, 1e-12);
  // int32 targets give the same loss.
  EXPECT_EQ(ops::cross_entropy(logits, targets_of({2, 0}, {2}, DType::i32)).item(),
            ops::cross_entropy(logits, targets_of({2, 0}, {2})).item());
}

TEST(CrossEntropy, MatchesTheReferenceOnBatchedLogits) {
  Tensor logits = random_f64({2, 3, 7}, 80, -4, 4);
  Tensor targets = targets_of({0, 6, 3, 2, 5, 1}, {2, 3});
  Tensor loss = ops::cross_entropy(logits, targets);
  EXPECT_EQ(loss.dtype(), DType::f64);
  EXPECT_NEAR(loss.item(), reference_cross_entropy(logits, targets), 1e-12);
  // A transposed (non-contiguous) view of logits reads the same values.
  Tensor lt = random_f64({7, 4}, 81).t();
  Tensor t4 = targets_of({1, 0, 6, 3}, {4});
  EXPECT_NEAR(ops::cross_entropy(lt, t4).item(), reference_cross_entropy(lt, t4), 1e-12);
}

TEST(CrossEntropy, IgnoredTargetsDropOutOfTheMeanAndGetZeroGradient) {
  Tensor logits = random_f64({3, 4}, 82).set_requires_grad();
  Tensor loss = ops::cross_entropy(logits, targets_of({2, -100, 0}, {3}));
  Tensor kept = ops::cross_entropy(logits.detach().slice(0, 0, 3, 2), targets_of({2, 0}, {2}));
  EXPECT_NEAR(loss.item(), kept.item(), 1e-12);
  loss.backward();
  std::vector<double> grad = logits.grad().to_vector<double>();
  for (int j = 0; j < 4; ++j) EXPECT_EQ(grad[4 + j], 0.0);
  // A custom ignore_index: class 1 is ignored, -100 is then out of range.
  Tensor l2 = ops::cross_entropy(logits.detach(), targets_of({2, 1, 0}, {3}), 1);
  EXPECT_NEAR(l2.item(), kept.item(), 1e-12);
  expect_error(
      [&] {
        ops::cross_entropy(logits.detach(), targets_of({2, -100, 0}, {3}), 1);
      },
      "cross_entropy: target -100 (at flat index 1) is out of range for 4 classes; expected a class in [0, "
      "3] or ignore_index (1)");
}

TEST(CrossEntropy, AllTargetsIgnoredGivesNanAsPyTorch) {
  Tensor logits = random_f64({2, 3}, 83).set_requires_grad();
  Tensor loss = ops::cross_entropy(logits, targets_of({-100, -100}, {2}));
  EXPECT_TRUE(std::isnan(loss.item()));
  loss.backward();
  expect_close(logits.grad(), zeros({2, 3}, DType::f64), 0, 0);
}

TEST(CrossEntropy, LargeLogitsStayFinite) {
  Tensor logits = tensor({1000, 1001}).reshape({1, 2}).set_requires_grad();
  Tensor loss = ops::cross_entropy(logits, targets_of({0}, {1}));
  EXPECT_NEAR(loss.item(), 1.3132616875182228, 1e-5);
  loss.backward();
  expect_close(logits.grad(), tensor({0.2689414213699951 - 1, 0.7310585786300049}).reshape({1, 2}), 1e-6);
  EXPECT_NEAR(ops::cross_entropy(tensor({-1000, 1000}).reshape({1, 2}), targets_of({1}, {1})).item(), 0.0, 1e-6);
}

TEST(CrossEntropy, HalfLogitsGiveAFloatLoss) {
  Tensor logits = random_f64({4, 10}, 84, -3, 3);
  Tensor targets = targets_of({9, 0, 4, 7}, {4});
  for (DType dtype : {DType::f16, DType::bf16}) {
    Tensor lh = logits.to(dtype).set_requires_grad();
    Tensor loss = ops::cross_entropy(lh, targets);
    EXPECT_EQ(loss.dtype(), DType::f32);
    EXPECT_NEAR(loss.item(), reference_cross_entropy(lh, targets), 1e-5);
    loss.backward();
    EXPECT_EQ(lh.grad().dtype(), dtype);
  }
}

TEST(CrossEntropy, ManyRowsInParallelMatchTheReference) {
  // 512 rows of 100 classes, some ignored: the parallel path.
  Tensor logits = random_f64({512, 100}, 85, -5, 5).set_requires_grad();
  std::vector<int64_t> t(512);
  for (int64_t r = 0; r < 512; ++r) t[r] = r % 9 == 0 ? -100 : (r * 37) % 100;
  Tensor targets = targets_of(t, {512});
  Tensor loss = ops::cross_entropy(logits, targets);
  EXPECT_NEAR(loss.item(), reference_cross_entropy(logits, targets), 1e-12);
  loss.backward();
  // Row r's gradient is (softmax(row) - onehot(t_r)) / n_valid.
  const double n_valid = 512 - 57;
  for (int64_t r : {1, 9, 511}) {
    Tensor expected = ops::softmax(logits.detach().select(0, r), 0);
    std::vector<double> e = expected.to_vector<double>();
    if (t[r] == -100)
      std::fill(e.begin(), e.end(), 0.0);
    else
      e[t[r]] -= 1;
    for (double& v : e) v /= n_valid;
    expect_close(logits.grad().select(0, r), from_vector(e, {100}), 1e-15, 1e-10);
  }
}

TEST(CrossEntropy, Errors) {
  Tensor logits = zeros({2, 5});
  expect_error(
      [&] {
        ops::cross_entropy(logits, targets_of({0, 5}, {2}));
      },
      "cross_entropy: target 5 (at flat index 1) is out of range for 5 classes");
  expect_error(
      [&] {
        ops::cross_entropy(logits, targets_of({-1, 0}, {2}));
      },
      "cross_entropy: target -1 (at flat index 0)");
  expect_error(
      [&] {
        ops::cross_entropy(logits, targets_of({0, 1, 2}, {3}));
      },
      "cross_entropy: targets [3] must have the shape of logits [2, 5] without the class dim, [2]");
  expect_error([&] { ops::cross_entropy(logits, zeros({2})); },
               "cross_entropy: targets must be an int32 or int64 tensor of class indices, got float32[2] on cpu");
  expect_error(
      [&] {
        ops::cross_entropy(targets_of({0, 1}, {1, 2}), targets_of({0}, {1}));
      },
      "cross_entropy: logits must be a floating tensor, got int64[1, 2] on cpu");
  expect_error([&] { ops::cross_entropy(Tensor(), targets_of({0}, {1})); },
               "cross_entropy: logits is an undefined tensor");
  expect_error([&] { ops::cross_entropy(scalar_tensor(1), targets_of({0}, {})); },
               "cross_entropy: logits must have a class dim");
}

TEST(CrossEntropy, GradientsMatchFiniteDifferences) {
  Tensor l1 = random_f64({3, 5}, 86, -2, 2);
  Tensor t1 = targets_of({4, 0, 2}, {3});
  expect_gradients_match([&](const std::vector<Tensor>& in) { return ops::cross_entropy(in[0], t1); }, {l1});
  Tensor l2 = random_f64({2, 3, 7}, 87, -2, 2);
  Tensor t2 = targets_of({6, -100, 3, 0, -100, 1}, {2, 3}, DType::i32);
  expect_gradients_match([&](const std::vector<Tensor>& in) { return ops::cross_entropy(in[0], in[1]); }, {l2, t2});
  Tensor t3 = targets_of({6, 2, 3, 0, 2, 1}, {2, 3});
  expect_gradients_match([&](const std::vector<Tensor>& in) { return ops::cross_entropy(in[0], t3, 2); }, {l2});
  // The gradient scales with the upstream gradient.
  expect_gradients_match([&](const std::vector<Tensor>& in) { return ops::cross_entropy(in[0], t1) * 3.5; }, {l1});
}

TEST(CrossEntropy, EvenlySpacedRowsAreReadInPlace) {
  // The first 7 columns of [2, 3, 10] logits: rows 10 apart, read without a copy.
  Tensor wide = random_f64({2, 3, 10}, 88, -3, 3);
  Tensor t = targets_of({0, 6, -100, 2, 5, 1}, {2, 3});
  Tensor narrow = wide.narrow(2, 0, 7);
  EXPECT_NEAR(ops::cross_entropy(narrow, t).item(), reference_cross_entropy(narrow.contiguous(), t), 1e-12);
  expect_gradients_match([&](const std::vector<Tensor>& in) { return ops::cross_entropy(in[0].narrow(2, 1, 7), t); },
                         {wide});
  // Every other row of a [6, 4] matrix, and rows of a single class.
  Tensor rows = random_f64({6, 4}, 89, -3, 3);
  Tensor t3 = targets_of({3, 0, 1}, {3});
  EXPECT_NEAR(ops::cross_entropy(rows.slice(0, 0, 6, 2), t3).item(),
              reference_cross_entropy(rows.slice(0, 0, 6, 2).contiguous(), t3), 1e-12);
  EXPECT_NEAR(ops::cross_entropy(rows.narrow(1, 2, 1), targets_of({0, 0, 0, 0, 0, 0}, {6})).item(), 0.0, 1e-12);
}

TEST(CrossEntropy, PaddedClassesAreNeitherScoredNorGivenAGradient) {
  // Logits [2, 3, 9] whose last 4 columns are padding (huge values that would dominate were they read).
  Tensor real = random_f64({2, 3, 5}, 90, -3, 3);
  Tensor padded = ops::cat({real, full({2, 3, 4}, 1e4, DType::f64)}, 2);
  Tensor t = targets_of({4, 0, -100, 2, 3, 1}, {2, 3});
  for (DType dtype : {DType::f64, DType::f32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dtype));
    Tensor p = padded.to(dtype).detach().set_requires_grad(), r = real.to(dtype).detach().set_requires_grad();
    Tensor loss = ops::cross_entropy(p, t, -100, 5), expected = ops::cross_entropy(r, t);
    EXPECT_EQ(loss.item(), expected.item());
    (loss * 1.5).backward();
    (expected * 1.5).backward();
    ASSERT_EQ(p.grad().shape(), Shape({2, 3, 9}));
    EXPECT_EQ(p.grad().dtype(), dtype);
    expect_close(p.grad().narrow(2, 0, 5), r.grad(), 0, 0);
    expect_close(p.grad().narrow(2, 5, 4), zeros({2, 3, 4}, dtype), 0, 0);
  }
  // The real columns of padded rows that are themselves a strided view.
  Tensor twice = random_f64({4, 9}, 91, -3, 3);
  Tensor t2 = targets_of({4, 1}, {2});
  expect_gradients_match(
      [&](const std::vector<Tensor>& in) { return ops::cross_entropy(in[0].slice(0, 0, 4, 2), t2, -100, 5); }, {twice});
  EXPECT_NEAR(ops::cross_entropy(twice.slice(0, 0, 4, 2), t2, -100, 5).item(),
              reference_cross_entropy(twice.slice(0, 0, 4, 2).narrow(1, 0, 5).contiguous(), t2), 1e-12);
  // Targets index the real classes only.
  expect_error(
      [&] {
        ops::cross_entropy(padded, targets_of({5, 0, 0, 0, 0, 0}, {2, 3}), -100, 5);
      },
      "cross_entropy: target 5 (at flat index 0) is out of range for 5 classes");
  expect_error([&] { ops::cross_entropy(padded, t, -100, 10); },
               "cross_entropy: 10 classes do not fit logits [2, 3, 9]");
}

// ---- the fused classifier: loss and gradient from one pass

namespace {

// The gradient cross_entropy_with_grad promises, d (factor * loss) / d logits, in double:
// factor (softmax - onehot) / n_valid over the first `classes` columns, zeros elsewhere.
std::vector<double> reference_gradient(const Tensor& logits, const std::vector<int64_t>& t, int64_t classes,
                                       double factor) {
  const int64_t width = logits.shape().back();
  const std::vector<double> x = logits.to_vector<double>();
  int64_t valid = 0;
  for (int64_t target : t) valid += target != -100;
  std::vector<double> g(x.size(), 0.0);
  for (size_t r = 0; r < t.size(); ++r) {
    if (t[r] == -100) continue;
    const double* xr = x.data() + r * width;
    double m = -INFINITY, s = 0;
    for (int64_t j = 0; j < classes; ++j) m = std::max(m, xr[j]);
    for (int64_t j = 0; j < classes; ++j) s += std::exp(xr[j] - m);
    for (int64_t j = 0; j < classes; ++j)
      g[r * width + j] = factor * (std::exp(xr[j] - m) / s - (j == t[r] ? 1.0 : 0.0)) / static_cast<double>(valid);
  }
  return g;
}

}  // namespace

TEST(CrossEntropyWithGrad, GivesTheLossAndTheGradientTheBackwardWould) {
  // Padded [2, 3, 9] logits, 5 real classes, an ignored row: the loss as cross_entropy's and the
  // gradient as (factor * loss).backward() gives, to the bit (the same kernels on the CPU).
  const std::vector<int64_t> t = {4, 0, -100, 2, 3, 1};
  Tensor targets = targets_of(t, {2, 3});
  Tensor padded = ops::cat({random_f64({2, 3, 5}, 92, -3, 3), full({2, 3, 4}, 1e4, DType::f64)}, 2);
  for (DType dtype : {DType::f64, DType::f32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dtype));
    Tensor logits = padded.to(dtype);
    const double factor = 0.375;
    ops::LossAndGradient fused =
        ops::cross_entropy_with_grad(logits, targets, scalar_tensor(factor, DType::f32), -100, 5);
    Tensor p = logits.detach().set_requires_grad();
    Tensor loss = ops::cross_entropy(p, targets, -100, 5);
    (loss * factor).backward();
    EXPECT_EQ(fused.loss.item(), loss.item());
    EXPECT_FALSE(fused.loss.requires_grad());
    ASSERT_EQ(fused.grad.shape(), logits.shape());
    EXPECT_EQ(fused.grad.dtype(), dtype);
    expect_close(fused.grad, p.grad(), 0, 0);
    const double tolerance = dtype == DType::bf16 ? 1e-2 : 1e-6;
    EXPECT_NEAR(fused.loss.item(), reference_cross_entropy(logits.narrow(2, 0, 5).contiguous(), targets), tolerance);
    expect_close(fused.grad, from_vector(reference_gradient(logits, t, 5, factor), logits.shape()).to(dtype), tolerance,
                 tolerance * 1e-2);
  }
}

TEST(CrossEntropyWithGrad, OverwritesTheLogitsWhenAsked) {
  const std::vector<int64_t> t = {3, -100, 0, 6};
  Tensor targets = targets_of(t, {4});
  for (DType dtype : {DType::f64, DType::f32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dtype));
    Tensor logits = random_f64({4, 8}, 93, -3, 3).to(dtype);
    const Tensor original = logits.clone();
    const Tensor factor = scalar_tensor(2.0, DType::f32);
    ops::LossAndGradient apart = ops::cross_entropy_with_grad(logits, targets, factor, -100, 7);
    expect_close(logits, original, 0, 0);  // untouched without overwrite_logits
    ops::LossAndGradient over = ops::cross_entropy_with_grad(logits, targets, factor, -100, 7, true);
    EXPECT_EQ(over.loss.item(), apart.loss.item());
    EXPECT_EQ(over.grad.raw_data(), logits.raw_data());  // written over the logits
    expect_close(over.grad, apart.grad, 0, 0);
    expect_close(logits, apart.grad, 0, 0);
  }
}

TEST(CrossEntropyWithGrad, Errors) {
  Tensor logits = random_f64({4, 6}, 94, -3, 3);
  Tensor targets = targets_of({1, 2, 3, 4}, {4});
  expect_error([&] { ops::cross_entropy_with_grad(logits, targets, Tensor()); },
               "cross_entropy_with_grad: grad_factor");
  expect_error([&] { ops::cross_entropy_with_grad(logits, targets, zeros({2})); },
               "cross_entropy_with_grad: grad_factor must be a scalar on the logits' device (cpu)");
  expect_error(
      [&] { ops::cross_entropy_with_grad(logits.slice(1, 0, 6, 2), targets, scalar_tensor(1.0), -100, -1, true); },
      "cross_entropy_with_grad: overwrite_logits needs dense logits to write the gradient over");
  expect_error(
      [&] {
        ops::cross_entropy_with_grad(logits, targets_of({1, 2, 6, 0}, {4}), scalar_tensor(1.0));
      },
      "cross_entropy: target 6 (at flat index 2) is out of range for 6 classes");
  // A failed call writes nothing over the logits.
  const Tensor before = logits.clone();
  expect_error(
      [&] {
        ops::cross_entropy_with_grad(logits, targets_of({1, 7, 0, 0}, {4}), scalar_tensor(1.0), -100, -1, true);
      },
      "out of range");
  expect_close(logits, before, 0, 0);
}
