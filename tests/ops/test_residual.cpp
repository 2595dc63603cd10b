// add_relu on the CPU against relu(add(...)), its layout rule and its gradients.
#include <gtest/gtest.h>

#include <cmath>

#include "ops/conv.h"
#include "ops/ops.h"
#include "ops/residual.h"
#include "support/errors.h"
#include "support/gradcheck.h"

using namespace precis;
using precis::testing::expect_close;
using precis::testing::expect_error;
using precis::testing::expect_gradients_match;
using precis::testing::random_f64;

TEST(AddRelu, EqualsReluOfTheSumAndKeepsXsLayout) {
  Tensor x = random_f64({2, 3, 4, 5}, 1), r = random_f64({2, 3, 4, 5}, 2);
  const Tensor expected = ops::relu(ops::add(x, r));
  for (auto x_format : {ops::MemoryFormat::contiguous, ops::MemoryFormat::channels_last})
    for (auto r_format : {ops::MemoryFormat::contiguous, ops::MemoryFormat::channels_last}) {
      Tensor y = ops::add_relu(ops::to_memory_format(x, x_format), ops::to_memory_format(r, r_format));
      expect_close(y, expected, 0, 0);
      EXPECT_EQ(ops::is_channels_last(y), x_format == ops::MemoryFormat::channels_last);
    }
  // other ranks, halves (summed in f32, rounded once), NaN
  expect_close(ops::add_relu(tensor({-1, 2, 0.5}), tensor({0.5, -3, 1})), tensor({0, 0, 1.5}), 0, 0);
  Tensor h = ops::add_relu(x.to(DType::bf16), r.to(DType::bf16));
  EXPECT_EQ(h.dtype(), DType::bf16);
  expect_close(
      h, ops::relu(ops::add(x.to(DType::bf16).to(DType::f32), r.to(DType::bf16).to(DType::f32))).to(DType::bf16), 0, 0);
  EXPECT_TRUE(std::isnan(ops::add_relu(tensor({std::nan("")}), tensor({1})).item()));
}

TEST(AddRelu, GradientsMatchFiniteDifferences) {
  uint64_t seed = 10;
  for (auto format : {ops::MemoryFormat::contiguous, ops::MemoryFormat::channels_last}) {
    expect_gradients_match(
        [format](const std::vector<Tensor>& in) { return ops::add_relu(ops::to_memory_format(in[0], format), in[1]); },
        {random_f64({2, 3, 3, 4}, seed++), random_f64({2, 3, 3, 4}, seed++)});
  }
  // the same tensor on both sides (an identity shortcut of a block that changes nothing)
  expect_gradients_match([](const std::vector<Tensor>& in) { return ops::add_relu(in[0], in[0]); },
                         {random_f64({3, 4}, seed++)});
}

TEST(AddRelu, ErrorsNameTheProblem) {
  expect_error([] { ops::add_relu(zeros({2, 3}), zeros({3, 2})); }, "must have one shape and dtype");
  expect_error([] { ops::add_relu(zeros({2, 3}), zeros({2, 3}, DType::f64)); }, "must have one shape and dtype");
}
