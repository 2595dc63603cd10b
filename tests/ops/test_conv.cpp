// conv2d on the CPU against a direct convolution in plain loops, its gradients against
// central differences for every option and both memory formats, and the memory-format helpers.
#include <gtest/gtest.h>

#include <vector>

#include "ops/autocast.h"
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

// The definition of ops/conv.h, one output value at a time, in double.
Tensor direct_conv2d(const Tensor& x, const Tensor& w, const Tensor& b, const ops::Conv2dOptions& o) {
  const int64_t N = x.size(0), Cin = x.size(1), H = x.size(2), W = x.size(3);
  const int64_t Cout = w.size(0), Cg = w.size(1), kH = w.size(2), kW = w.size(3), Cog = Cout / o.groups;
  const int64_t OH = (H + 2 * o.padding[0] - o.dilation[0] * (kH - 1) - 1) / o.stride[0] + 1;
  const int64_t OW = (W + 2 * o.padding[1] - o.dilation[1] * (kW - 1) - 1) / o.stride[1] + 1;
  const std::vector<double> xv = x.to_vector<double>(), wv = w.to_vector<double>();
  const std::vector<double> bv = b.defined() ? b.to_vector<double>() : std::vector<double>(Cout, 0.0);
  std::vector<double> y(N * Cout * OH * OW);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t co = 0; co < Cout; ++co)
      for (int64_t oh = 0; oh < OH; ++oh)
        for (int64_t ow = 0; ow < OW; ++ow) {
          double acc = bv[co];
          for (int64_t c = 0; c < Cg; ++c)
            for (int64_t kh = 0; kh < kH; ++kh)
              for (int64_t kw = 0; kw < kW; ++kw) {
                const int64_t ih = oh * o.stride[0] - o.padding[0] + kh * o.dilation[0];
                const int64_t iw = ow * o.stride[1] - o.padding[1] + kw * o.dilation[1];
                if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                const int64_t ci = (co / Cog) * Cg + c;
                acc += xv[((n * Cin + ci) * H + ih) * W + iw] * wv[((co * Cg + c) * kH + kh) * kW + kw];
              }
          y[((n * Cout + co) * OH + oh) * OW + ow] = acc;
        }
  return from_vector(y, {N, Cout, OH, OW});
}

struct Case {
  Shape x, w;
  ops::Conv2dOptions options;
};

// Odd sizes, every option alone and together, a 1x1 and a depthwise conv.
std::vector<Case> cases() {
  return {
      {{2, 3, 7, 6}, {4, 3, 3, 3}, {}},
      {{2, 3, 7, 6}, {4, 3, 3, 2}, {{2, 1}, {0, 0}, {1, 1}, 1}},
      {{1, 2, 6, 7}, {3, 2, 3, 3}, {{1, 1}, {1, 2}, {1, 1}, 1}},
      {{2, 2, 7, 7}, {2, 2, 2, 3}, {{1, 1}, {0, 0}, {2, 2}, 1}},
      {{2, 4, 5, 6}, {6, 2, 3, 3}, {{1, 1}, {1, 1}, {1, 1}, 2}},
      {{2, 3, 9, 8}, {6, 1, 3, 3}, {{2, 2}, {2, 1}, {2, 1}, 3}},
      {{3, 5, 4, 4}, {7, 5, 1, 1}, {}},
      {{1, 1, 5, 5}, {2, 1, 5, 5}, {{1, 1}, {4, 4}, {1, 1}, 1}},  // padding as large as the kernel
  };
}

}  // namespace

TEST(MemoryFormat, ChannelsLastHasNhwcStridesAndRoundTrips) {
  Tensor x = random_f64({2, 3, 4, 5}, 1);
  EXPECT_FALSE(ops::is_channels_last(x));
  Tensor cl = ops::to_memory_format(x, ops::MemoryFormat::channels_last);
  EXPECT_TRUE(ops::is_channels_last(cl));
  EXPECT_EQ(cl.strides(), (Shape{60, 1, 15, 3}));
  expect_close(cl, x, 0, 0);
  EXPECT_TRUE(ops::to_memory_format(cl, ops::MemoryFormat::channels_last).same(cl));
  Tensor back = ops::to_memory_format(cl, ops::MemoryFormat::contiguous);
  EXPECT_TRUE(back.is_contiguous());
  expect_close(back, x, 0, 0);
  // A channel dim of 1 reads the same either way: it counts as contiguous.
  EXPECT_FALSE(
      ops::is_channels_last(ops::to_memory_format(random_f64({2, 1, 3, 3}, 2), ops::MemoryFormat::channels_last)));
  expect_error([] { ops::to_memory_format(zeros({2, 3}), ops::MemoryFormat::channels_last); }, "4-D");
  expect_gradients_match(
      [](const std::vector<Tensor>& in) { return ops::to_memory_format(in[0], ops::MemoryFormat::channels_last); },
      {random_f64({2, 3, 2, 2}, 3)});
}

TEST(Conv2d, MatchesTheDirectConvolution) {
  uint64_t seed = 10;
  for (const Case& c : cases()) {
    Tensor x = random_f64(c.x, seed++), w = random_f64(c.w, seed++), b = random_f64({c.w[0]}, seed++);
    const Tensor expected = direct_conv2d(x, w, b, c.options);
    expect_close(ops::conv2d(x, w, b, c.options), expected, 1e-12, 1e-12);
    expect_close(ops::conv2d(x, w, Tensor(), c.options), direct_conv2d(x, w, Tensor(), c.options), 1e-12, 1e-12);
    // channels-last in, channels-last out, same values
    // (with one input channel the channels-last copy is contiguous too, and so is the output)
    Tensor x_cl = ops::to_memory_format(x, ops::MemoryFormat::channels_last);
    Tensor y_cl = ops::conv2d(x_cl, w, b, c.options);
    EXPECT_EQ(ops::is_channels_last(y_cl), ops::is_channels_last(x_cl)) << c.x;
    expect_close(y_cl, expected, 1e-12, 1e-12);
    // f32 runs in f32
    expect_close(ops::conv2d(x.to(DType::f32), w.to(DType::f32), b.to(DType::f32), c.options), expected, 1e-5, 1e-5);
  }
}

TEST(Conv2d, HalfInputsRunInF32AndRoundOnce) {
  Tensor x = random_f64({2, 3, 6, 6}, 20), w = random_f64({4, 3, 3, 3}, 21);
  for (DType dtype : {DType::f16, DType::bf16}) {
    Tensor y = ops::conv2d(x.to(dtype), w.to(dtype), Tensor(), {});
    EXPECT_EQ(y.dtype(), dtype);
    // The exact result for the rounded inputs, rounded once to dtype.
    Tensor expected = direct_conv2d(x.to(dtype), w.to(dtype), Tensor(), {}).to(dtype);
    expect_close(y, expected, 1e-2, dtype == DType::bf16 ? 8e-3 : 1e-3);
  }
}

TEST(Conv2d, GradientsMatchFiniteDifferencesForEveryOptionAndFormat) {
  uint64_t seed = 30;
  for (const Case& c : cases()) {
    for (auto format : {ops::MemoryFormat::contiguous, ops::MemoryFormat::channels_last}) {
      SCOPED_TRACE(::testing::Message() << "x " << c.x << " w " << c.w << " groups " << c.options.groups
                                        << (format == ops::MemoryFormat::channels_last ? " channels-last" : ""));
      Tensor x = random_f64(c.x, seed++), w = random_f64(c.w, seed++), b = random_f64({c.w[0]}, seed++);
      const ops::Conv2dOptions options = c.options;
      expect_gradients_match(
          [options, format](const std::vector<Tensor>& in) {
            return ops::conv2d(ops::to_memory_format(in[0], format), in[1], in[2], options);
          },
          {x, w, b});
    }
  }
}

TEST(Conv2d, GradientOfXAloneAndOfWeightAlone) {
  Tensor x = random_f64({2, 2, 5, 5}, 40), w = random_f64({3, 2, 3, 3}, 41);
  expect_gradients_match([&](const std::vector<Tensor>& in) { return ops::conv2d(in[0], w, Tensor(), {}); }, {x});
  expect_gradients_match([&](const std::vector<Tensor>& in) { return ops::conv2d(x, in[0], Tensor(), {}); }, {w});
}

TEST(Conv2d, RunsInTheComputeDtypeUnderAutocast) {
  Tensor x = random_f64({1, 2, 4, 4}, 50).to(DType::f32), w = random_f64({3, 2, 3, 3}, 51).to(DType::f32);
  ops::autocast::Scope scope(DType::bf16);
  EXPECT_EQ(ops::conv2d(x, w, Tensor()).dtype(), DType::bf16);
}

TEST(Conv2d, ErrorsNameTheProblem) {
  Tensor x = zeros({1, 4, 5, 5}), w = zeros({6, 2, 3, 3});
  expect_error([&] { ops::conv2d(x, w, Tensor(), {{1, 1}, {0, 0}, {1, 1}, 3}); }, "groups (3) must divide");
  expect_error([&] { ops::conv2d(x, w, Tensor(), {}); }, "Cin / groups = 4");
  expect_error([&] { ops::conv2d(x, zeros({6, 4, 7, 7}), Tensor(), {}); }, "larger than the padded input");
  expect_error([&] { ops::conv2d(x, zeros({6, 4, 3, 3}), zeros({5}), {}); }, "bias must be [6]");
  expect_error([&] { ops::conv2d(x, zeros({6, 4, 3, 3}, DType::f64), Tensor(), {}); }, "one dtype");
  expect_error([&] { ops::conv2d(zeros({4, 5, 5}), w, Tensor(), {}); }, "4-D");
  expect_error([&] { ops::conv2d(x, zeros({6, 4, 3, 3}), Tensor(), {{0, 1}, {0, 0}, {1, 1}, 1}); }, "stride");
}
