// The GELU row passes of the fused linear kernels (ops/cpu/gelu_rows.h), whichever clone the CPU
// runs (AVX2 here where it has it), against ops/cpu/gelu.h's formula one value at a time in this
// file's baseline code: the same bits, over widths that leave vector tails and over values past
// the tanh's clamp (|u| > 7.9) and its +-1 (|u| > 9).
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "ops/cpu/gelu.h"
#include "ops/cpu/gelu_rows.h"

using namespace precis::ops::cpu;

namespace {

std::vector<float> values(int64_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-12.0f, 12.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  const float edges[] = {0.0f, -0.0f, 7.9f, -7.9f, 9.5f, -9.5f, 1e-20f, 100.0f};
  for (size_t i = 0; i < std::size(edges) && i < v.size(); ++i) v[i * 3 % v.size()] = edges[i];
  return v;
}

void expect_same_bits(const std::vector<float>& got, const std::vector<float>& want, int64_t width) {
  ASSERT_EQ(got.size(), want.size());
  EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0) << "width " << width;
}

}  // namespace

TEST(GeluRows, BiasAndGeluEqualTheFormulaBitForBit) {
  for (int64_t width : {1, 3, 8, 17, 64, 67}) {
    const std::vector<float> x = values(width, 1), bias = values(width, 2);
    std::vector<float> y = x, pre(width), want_y(width), want_pre(width);
    for (int64_t j = 0; j < width; ++j) {
      want_pre[j] = x[j] + bias[j];
      want_y[j] = gelu(want_pre[j]);
    }
    bias_gelu_row(y.data(), bias.data(), pre.data(), width, true);
    expect_same_bits(pre, want_pre, width);
    expect_same_bits(y, want_y, width);

    std::vector<float> biased = x, want_biased(width);  // the bias alone, no GELU
    for (int64_t j = 0; j < width; ++j) want_biased[j] = x[j] + bias[j];
    bias_gelu_row(biased.data(), bias.data(), nullptr, width, false);
    expect_same_bits(biased, want_biased, width);
  }
}

TEST(GeluRows, BackwardEqualsTheFormulaBitForBitAlsoInPlace) {
  for (int64_t width : {1, 5, 16, 31, 64, 67}) {
    const std::vector<float> g = values(width, 3), z = values(width, 4);
    std::vector<float> want(width), d(width), in_place = g;
    for (int64_t j = 0; j < width; ++j) want[j] = g[j] * gelu_derivative(z[j]);
    gelu_backward_row(d.data(), g.data(), z.data(), width);
    expect_same_bits(d, want, width);
    gelu_backward_row(in_place.data(), in_place.data(), z.data(), width);
    expect_same_bits(in_place, want, width);
  }
}
