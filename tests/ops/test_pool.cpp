// Pooling on the CPU against plain-loop references of PyTorch's definitions, gradients
// against central differences, both memory formats.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "ops/conv.h"
#include "ops/ops.h"
#include "ops/pool.h"
#include "support/errors.h"
#include "support/gradcheck.h"

using namespace precis;
using precis::testing::expect_close;
using precis::testing::expect_error;
using precis::testing::expect_gradients_match;
using precis::testing::random_f64;

namespace {

enum class Kind { max, avg };

// PyTorch's max_pool2d / avg_pool2d (count_include_pad) over the padded input, in double.
Tensor reference_pool(const Tensor& x, Kind kind, std::array<int64_t, 2> k, std::array<int64_t, 2> s,
                      std::array<int64_t, 2> pad) {
  const int64_t N = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3);
  const int64_t OH = (H + 2 * pad[0] - k[0]) / s[0] + 1, OW = (W + 2 * pad[1] - k[1]) / s[1] + 1;
  const std::vector<double> v = x.to_vector<double>();
  std::vector<double> y;
  for (int64_t nc = 0; nc < N * C; ++nc)
    for (int64_t oh = 0; oh < OH; ++oh)
      for (int64_t ow = 0; ow < OW; ++ow) {
        double best = -std::numeric_limits<double>::infinity(), sum = 0;
        for (int64_t i = 0; i < k[0]; ++i)
          for (int64_t j = 0; j < k[1]; ++j) {
            const int64_t h = oh * s[0] - pad[0] + i, w = ow * s[1] - pad[1] + j;
            if (h < 0 || h >= H || w < 0 || w >= W) continue;  // padding: -inf for max, 0 for the sum
            best = std::max(best, v[(nc * H + h) * W + w]);
            sum += v[(nc * H + h) * W + w];
          }
        y.push_back(kind == Kind::max ? best : sum / static_cast<double>(k[0] * k[1]));
      }
  return from_vector(y, {N, C, OH, OW});
}

// adaptive_avg_pool2d: window [floor(i H / O), ceil((i + 1) H / O)).
Tensor reference_adaptive(const Tensor& x, std::array<int64_t, 2> out) {
  const int64_t N = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3);
  const std::vector<double> v = x.to_vector<double>();
  std::vector<double> y;
  for (int64_t nc = 0; nc < N * C; ++nc)
    for (int64_t i = 0; i < out[0]; ++i)
      for (int64_t j = 0; j < out[1]; ++j) {
        const int64_t h0 = static_cast<int64_t>(std::floor(double(i * H) / out[0]));
        const int64_t h1 = static_cast<int64_t>(std::ceil(double((i + 1) * H) / out[0]));
        const int64_t w0 = static_cast<int64_t>(std::floor(double(j * W) / out[1]));
        const int64_t w1 = static_cast<int64_t>(std::ceil(double((j + 1) * W) / out[1]));
        double sum = 0;
        for (int64_t h = h0; h < h1; ++h)
          for (int64_t w = w0; w < w1; ++w) sum += v[(nc * H + h) * W + w];
        y.push_back(sum / static_cast<double>((h1 - h0) * (w1 - w0)));
      }
  return from_vector(y, {N, C, out[0], out[1]});
}

struct Window {
  std::array<int64_t, 2> kernel, stride, padding;
};

std::vector<Window> windows() {
  return {{{2, 2}, {0, 0}, {0, 0}},  // stride defaults to the kernel
          {{3, 3}, {2, 2}, {1, 1}},  // ResNet's stem
          {{3, 2}, {1, 2}, {1, 0}},
          {{2, 3}, {2, 1}, {1, 1}},
          {{1, 1}, {2, 2}, {0, 0}}};
}

constexpr ops::MemoryFormat kFormats[] = {ops::MemoryFormat::contiguous, ops::MemoryFormat::channels_last};

}  // namespace

TEST(Pool, MaxAndAvgMatchTheReference) {
  uint64_t seed = 100;
  for (const Window& w : windows()) {
    Tensor x = random_f64({2, 3, 7, 6}, seed++);
    const auto stride = w.stride[0] == 0 ? w.kernel : w.stride;
    for (auto format : kFormats) {
      Tensor xf = ops::to_memory_format(x, format);
      Tensor y_max = ops::max_pool2d(xf, w.kernel, w.stride, w.padding);
      Tensor y_avg = ops::avg_pool2d(xf, w.kernel, w.stride, w.padding);
      expect_close(y_max, reference_pool(x, Kind::max, w.kernel, stride, w.padding), 0, 0);
      expect_close(y_avg, reference_pool(x, Kind::avg, w.kernel, stride, w.padding), 1e-15, 1e-14);
      EXPECT_EQ(ops::is_channels_last(y_max), format == ops::MemoryFormat::channels_last);
      EXPECT_EQ(ops::is_channels_last(y_avg), format == ops::MemoryFormat::channels_last);
    }
  }
}

TEST(Pool, AdaptiveAvgMatchesTheReference) {
  uint64_t seed = 200;
  const std::vector<std::pair<Shape, std::array<int64_t, 2>>> cases = {{{2, 3, 7, 5}, {1, 1}},
                                                                       {{2, 3, 7, 5}, {3, 2}},
                                                                       {{1, 2, 4, 4}, {4, 4}},
                                                                       {{1, 2, 3, 5}, {5, 7}},
                                                                       {{2, 4, 8, 8}, {2, 4}}};
  for (const auto& [shape, out] : cases) {
    Tensor x = random_f64(shape, seed++);
    for (auto format : kFormats) {
      Tensor y = ops::adaptive_avg_pool2d(ops::to_memory_format(x, format), out);
      expect_close(y, reference_adaptive(x, out), 1e-15, 1e-14);
    }
  }
}

TEST(Pool, MaxPoolPropagatesNaNAndKeepsHalfDtypes) {
  Tensor x = tensor({1, 2, std::nan(""), 0}).reshape({1, 1, 2, 2});
  EXPECT_TRUE(std::isnan(ops::max_pool2d(x, {2, 2}).item()));
  Tensor h = random_f64({1, 2, 4, 4}, 300).to(DType::bf16);
  Tensor y = ops::avg_pool2d(h, {2, 2});
  EXPECT_EQ(y.dtype(), DType::bf16);
  expect_close(y, reference_pool(h.to(DType::f64), Kind::avg, {2, 2}, {2, 2}, {0, 0}).to(DType::bf16), 0, 0);
}

TEST(Pool, GradientsMatchFiniteDifferences) {
  uint64_t seed = 400;
  for (const Window& w : windows()) {
    for (auto format : kFormats) {
      SCOPED_TRACE(::testing::Message() << "kernel " << w.kernel[0] << "x" << w.kernel[1] << " stride " << w.stride[0]
                                        << "," << w.stride[1] << " padding " << w.padding[0] << "," << w.padding[1]
                                        << (format == ops::MemoryFormat::channels_last ? " channels-last" : ""));
      Tensor x = random_f64({2, 3, 7, 6}, seed++);
      expect_gradients_match(
          [w, format](const std::vector<Tensor>& in) {
            return ops::max_pool2d(ops::to_memory_format(in[0], format), w.kernel, w.stride, w.padding);
          },
          {x});
      expect_gradients_match(
          [w, format](const std::vector<Tensor>& in) {
            return ops::avg_pool2d(ops::to_memory_format(in[0], format), w.kernel, w.stride, w.padding);
          },
          {x});
    }
  }
  for (auto out : {std::array<int64_t, 2>{1, 1}, std::array<int64_t, 2>{3, 2}, std::array<int64_t, 2>{5, 7}}) {
    for (auto format : kFormats) {
      expect_gradients_match(
          [out, format](const std::vector<Tensor>& in) {
            return ops::adaptive_avg_pool2d(ops::to_memory_format(in[0], format), out);
          },
          {random_f64({2, 3, 4, 5}, seed++)});
    }
  }
}

// Max pooling keeps each maximum's place in its window: a byte for windows of up to 256 cells,
// i32 beyond. A 17x16 window (272 places), with the padding that puts places past 256 on real
// cells, takes the i32 indices; the forward against the reference, the backward against
// finite differences.
TEST(Pool, MaxPoolWindowsOfMoreThan256Cells) {
  for (auto format : kFormats) {
    Tensor x = random_f64({1, 2, 20, 19}, 450);
    const std::array<int64_t, 2> kernel{17, 16}, stride{3, 3}, padding{8, 8};
    expect_close(ops::max_pool2d(ops::to_memory_format(x, format), kernel, stride, padding),
                 reference_pool(x, Kind::max, kernel, stride, padding), 0, 0);
    expect_gradients_match(
        [&](const std::vector<Tensor>& in) {
          return ops::max_pool2d(ops::to_memory_format(in[0], format), kernel, stride, padding);
        },
        {x});
  }
}

TEST(Pool, MaxPoolGradientGoesToTheMaximumOnly) {
  // Overlapping windows (3x3, stride 1): the 9 at the centre is the max of all four windows.
  Tensor x_leaf = tensor({1, 2, 3, 4, 9, 5, 6, 7, 8}).reshape({1, 1, 3, 3});
  x_leaf.set_requires_grad();
  ops::sum(ops::max_pool2d(x_leaf, {2, 2}, {1, 1})).backward();
  expect_close(x_leaf.grad(), tensor({0, 0, 0, 0, 4, 0, 0, 0, 0}).reshape({1, 1, 3, 3}), 0, 0);
}

TEST(Pool, ErrorsNameTheProblem) {
  Tensor x = zeros({1, 2, 5, 5});
  expect_error([&] { ops::max_pool2d(x, {2, 2}, {0, 0}, {2, 0}); }, "padding must be between 0 and half the kernel");
  expect_error([&] { ops::avg_pool2d(x, {6, 6}); }, "larger than the padded input");
  expect_error([&] { ops::max_pool2d(x, {0, 2}); }, "kernel and stride must be >= 1");
  expect_error([&] { ops::adaptive_avg_pool2d(x, {0, 1}); }, "output size must be >= 1");
  expect_error([&] { ops::max_pool2d(zeros({2, 5, 5}), {2, 2}); }, "4-D");
}
