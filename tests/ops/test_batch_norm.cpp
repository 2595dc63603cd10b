// batch_norm and batch_norm_relu on the CPU: PyTorch's running-statistics rule on a fixed input
// (values computed by hand), a plain-loop reference, gradients against central differences
// in training and eval, both memory formats.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "ops/autocast.h"
#include "ops/batch_norm.h"
#include "ops/conv.h"
#include "ops/ops.h"
#include "support/errors.h"
#include "support/gradcheck.h"

using namespace precis;
using precis::testing::expect_close;
using precis::testing::expect_error;
using precis::testing::expect_gradients_match;
using precis::testing::random_f64;

namespace {

// y = (x - mean) / sqrt(var + eps) w + b over dim 1, the batch's statistics (biased variance), in double.
Tensor reference_training(const Tensor& x, const Tensor& w, const Tensor& b, double eps, bool relu) {
  const int64_t N = x.size(0), C = x.size(1), S = x.numel() / (N * C);
  std::vector<double> v = x.contiguous().to_vector<double>(), y(v.size());
  for (int64_t c = 0; c < C; ++c) {
    double mean = 0, var = 0;
    for (int64_t n = 0; n < N; ++n)
      for (int64_t s = 0; s < S; ++s) mean += v[(n * C + c) * S + s] / (N * S);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t s = 0; s < S; ++s) var += std::pow(v[(n * C + c) * S + s] - mean, 2) / (N * S);
    const double wc = w.defined() ? w.to_vector<double>()[c] : 1, bc = b.defined() ? b.to_vector<double>()[c] : 0;
    for (int64_t n = 0; n < N; ++n)
      for (int64_t s = 0; s < S; ++s) {
        const int64_t i = (n * C + c) * S + s;
        y[i] = (v[i] - mean) / std::sqrt(var + eps) * wc + bc;
        if (relu) y[i] = std::max(y[i], 0.0);
      }
  }
  return from_vector(y, x.shape());
}

constexpr ops::MemoryFormat kFormats[] = {ops::MemoryFormat::contiguous, ops::MemoryFormat::channels_last};

}  // namespace

TEST(BatchNorm, RunningStatisticsFollowPyTorchsRule) {
  // x [2, 2, 1, 2]: channel 0 holds {1, 2, 3, 4}, channel 1 {0, 0, 2, 6}.
  //   channel 0: mean 2.5, biased var 1.25, unbiased 5/3
  //   channel 1: mean 2,   biased var 6,    unbiased 8
  for (auto format : kFormats) {
    Tensor x = ops::to_memory_format(tensor({1, 2, 0, 0, 3, 4, 2, 6}).reshape({2, 2, 1, 2}), format);
    Tensor running_mean = zeros({2}), running_var = ones({2});
    Tensor y = ops::batch_norm(x, Tensor(), Tensor(), running_mean, running_var, true, 0.1, 1e-5);
    // r = 0.9 r + 0.1 s
    expect_close(running_mean, tensor({0.25, 0.2}), 1e-7);
    expect_close(running_var, tensor({0.9 + 0.1 * 5.0 / 3.0, 0.9 + 0.1 * 8.0}), 1e-6);
    // y normalises with the biased variance
    const double a = 1 / std::sqrt(1.25 + 1e-5), b = 1 / std::sqrt(6 + 1e-5);
    expect_close(y, tensor({-1.5 * a, -0.5 * a, -2 * b, -2 * b, 0.5 * a, 1.5 * a, 0, 4 * b}).reshape({2, 2, 1, 2}),
                 1e-6);
    // a second step with momentum 0.5 on the same batch
    ops::batch_norm(x, Tensor(), Tensor(), running_mean, running_var, true, 0.5, 1e-5);
    expect_close(running_mean, tensor({0.5 * 0.25 + 0.5 * 2.5, 0.5 * 0.2 + 0.5 * 2}), 1e-6);
    expect_close(running_var, tensor({0.5 * (0.9 + 0.5 / 3.0) + 0.5 * 5.0 / 3.0, 0.5 * 1.7 + 0.5 * 8}), 1e-6);
    // eval normalises with the running statistics and leaves them alone
    Tensor y_eval = ops::batch_norm(x, Tensor(), Tensor(), running_mean, running_var, false, 0.1, 1e-5);
    const std::vector<double> rm = running_mean.to_vector<double>(), rv = running_var.to_vector<double>();
    EXPECT_NEAR(y_eval.to_vector<double>()[0], (1 - rm[0]) / std::sqrt(rv[0] + 1e-5), 1e-6);
    EXPECT_NEAR(y_eval.to_vector<double>()[7], (6 - rm[1]) / std::sqrt(rv[1] + 1e-5), 1e-6);
    expect_close(running_mean, tensor({1.375, 1.1}), 1e-6);
  }
}

TEST(BatchNorm, MatchesTheReferenceWithAndWithoutParameters) {
  Tensor x = random_f64({3, 4, 5, 2}, 500, -2, 3), w = random_f64({4}, 501), b = random_f64({4}, 502);
  for (auto format : kFormats) {
    Tensor xf = ops::to_memory_format(x, format);
    for (bool relu : {false, true}) {
      auto op = relu ? ops::batch_norm_relu : ops::batch_norm;
      Tensor y = op(xf, w, b, Tensor(), Tensor(), true, 0.1, 1e-3, Tensor());
      expect_close(y, reference_training(x, w, b, 1e-3, relu), 1e-12);
      EXPECT_EQ(ops::is_channels_last(y), format == ops::MemoryFormat::channels_last);
      expect_close(op(xf, Tensor(), Tensor(), Tensor(), Tensor(), true, 0.1, 1e-5, Tensor()),
                   reference_training(x, Tensor(), Tensor(), 1e-5, relu), 1e-12);
    }
  }
  // [N, C] and [N, C, L] inputs
  Tensor x2 = random_f64({6, 3}, 503), x3 = random_f64({2, 3, 5}, 504);
  expect_close(ops::batch_norm(x2, Tensor(), Tensor(), Tensor(), Tensor(), true),
               reference_training(x2, {}, {}, 1e-5, false), 1e-12);
  expect_close(ops::batch_norm(x3, Tensor(), Tensor(), Tensor(), Tensor(), true),
               reference_training(x3, {}, {}, 1e-5, false), 1e-12);
}

TEST(BatchNorm, HalfInputsKeepTheirDtypeWithF32Statistics) {
  Tensor x = random_f64({4, 3, 3, 3}, 510, -1, 2);
  for (DType dtype : {DType::f16, DType::bf16}) {
    Tensor running_mean = zeros({3}), running_var = ones({3});
    Tensor y = ops::batch_norm(x.to(dtype), ones({3}), zeros({3}), running_mean, running_var, true);
    EXPECT_EQ(y.dtype(), dtype);
    EXPECT_EQ(running_mean.dtype(), DType::f32);
    Tensor rounded = x.to(dtype).to(DType::f64);
    expect_close(y, reference_training(rounded, {}, {}, 1e-5, false), 2e-2, 1e-2);
    // the running mean is 0.1 * the batch mean of the rounded inputs, accumulated in f32
    expect_close(running_mean, ops::mul(ops::mean(rounded, {0, 2, 3}), 0.1), 1e-6);
  }
  // autocast leaves batch_norm in its input's dtype
  ops::autocast::Scope scope(DType::bf16);
  EXPECT_EQ(ops::batch_norm(x.to(DType::f32), Tensor(), Tensor(), Tensor(), Tensor(), true).dtype(), DType::f32);
}

TEST(BatchNorm, GradientsMatchFiniteDifferences) {
  uint64_t seed = 520;
  for (auto format : kFormats) {
    for (bool relu : {false, true}) {
      for (bool training : {true, false}) {
        SCOPED_TRACE(::testing::Message()
                     << (relu ? "batch_norm_relu" : "batch_norm") << (training ? " training" : " eval")
                     << (format == ops::MemoryFormat::channels_last ? " channels-last" : ""));
        auto op = relu ? ops::batch_norm_relu : ops::batch_norm;
        Tensor running_mean = random_f64({3}, seed++).to(DType::f32);
        Tensor running_var = random_f64({3}, seed++, 0.5, 2).to(DType::f32);
        expect_gradients_match(
            [=](const std::vector<Tensor>& in) {
              // eval reads the running statistics; training's update of copies does not feed back
              return op(ops::to_memory_format(in[0], format), in[1], in[2], running_mean.clone(), running_var.clone(),
                        training, 0.1, 1e-3, Tensor());
            },
            {random_f64({3, 3, 4, 3}, seed++), random_f64({3}, seed++), random_f64({3}, seed++)});
      }
    }
  }
  // no parameters; a [N, C] input
  expect_gradients_match(
      [](const std::vector<Tensor>& in) {
        return ops::batch_norm(in[0], Tensor(), Tensor(), Tensor(), Tensor(), true);
      },
      {random_f64({5, 4}, seed++)});
}

// relu(batch_norm(x) + r): the f64 reference plus r, then the relu; r may come in the other layout.
TEST(BatchNorm, AddReluMatchesTheReferenceAndItsGradientsFiniteDifferences) {
  Tensor x = random_f64({3, 4, 5, 2}, 530, -2, 3), r = random_f64({3, 4, 5, 2}, 531), w = random_f64({4}, 532),
         b = random_f64({4}, 533);
  const Tensor want = ops::relu(ops::add(reference_training(x, w, b, 1e-3, false), r));
  for (auto format : kFormats) {
    for (auto residual_format : kFormats) {
      Tensor y = ops::batch_norm_add_relu(ops::to_memory_format(x, format), ops::to_memory_format(r, residual_format),
                                          w, b, Tensor(), Tensor(), true, 0.1, 1e-3);
      expect_close(y, want, 1e-12);
      EXPECT_EQ(ops::is_channels_last(y), format == ops::MemoryFormat::channels_last);
    }
  }
  uint64_t seed = 540;
  for (auto format : kFormats) {
    for (bool training : {true, false}) {
      SCOPED_TRACE(::testing::Message() << "batch_norm_add_relu" << (training ? " training" : " eval")
                                        << (format == ops::MemoryFormat::channels_last ? " channels-last" : ""));
      Tensor running_mean = random_f64({3}, seed++).to(DType::f32);
      Tensor running_var = random_f64({3}, seed++, 0.5, 2).to(DType::f32);
      expect_gradients_match(
          [=](const std::vector<Tensor>& in) {
            return ops::batch_norm_add_relu(ops::to_memory_format(in[0], format), in[3], in[1], in[2],
                                            running_mean.clone(), running_var.clone(), training, 0.1, 1e-3);
          },
          {random_f64({3, 3, 4, 3}, seed++), random_f64({3}, seed++), random_f64({3}, seed++),
           random_f64({3, 3, 4, 3}, seed++)});
    }
  }
  expect_error(
      [&] {
        ops::batch_norm_add_relu(zeros({2, 3, 4, 4}), zeros({2, 3, 4, 3}), Tensor(), Tensor(), Tensor(), Tensor(),
                                 true);
      },
      "one shape and dtype");
}

TEST(BatchNorm, ErrorsNameTheProblem) {
  Tensor x = zeros({2, 3, 4, 4});
  expect_error([&] { ops::batch_norm(x, zeros({4}), Tensor(), Tensor(), Tensor(), true); }, "weight must be [3]");
  expect_error([&] { ops::batch_norm(x, Tensor(), Tensor(), zeros({3}), Tensor(), true); }, "go together");
  expect_error([&] { ops::batch_norm(x, Tensor(), Tensor(), Tensor(), Tensor(), false); }, "eval mode");
  expect_error(
      [&] {
        ops::batch_norm(zeros({1, 3, 1, 1}), Tensor(), Tensor(), Tensor(), Tensor(), true);
      },
      "more than one value per channel");
  expect_error([&] { ops::batch_norm(zeros({3}), Tensor(), Tensor(), Tensor(), Tensor(), true); }, "[N, C, ...]");
}
