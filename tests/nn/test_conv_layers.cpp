// The image layers as modules: what is a parameter and what a buffer, BatchNorm2d's modes
// and its running statistics (PyTorch's rule), PyTorch's default Conv2d initialisation, and
// Flatten's order under channels-last memory.
#include <gtest/gtest.h>

#include <cmath>

#include "core/autograd.h"
#include "nn/batch_norm.h"
#include "nn/conv.h"
#include "nn/flat_parameters.h"
#include "nn/layers.h"
#include "nn/pool.h"
#include "ops/conv.h"
#include "support/gradcheck.h"

using namespace precis;

TEST(BatchNorm2dModule, StatisticsAreBuffersNotParameters) {
  nn::BatchNorm2d bn(3);
  std::vector<std::string> params, buffers;
  for (const auto& p : bn.named_parameters()) params.push_back(p.name);
  for (const auto& b : bn.named_buffers()) buffers.push_back(b.name);
  EXPECT_EQ(params, (std::vector<std::string>{"weight", "bias"}));
  EXPECT_EQ(buffers, (std::vector<std::string>{"running_mean", "running_var", "num_batches_tracked"}));
  EXPECT_EQ(bn.state_dict().size(), 5u);
  auto flat = nn::flatten_parameters(bn);
  EXPECT_EQ(flat->numel(), 6) << "only weight and bias are packed for the optimizer";
}

// One training forward moves the running statistics by momentum towards the batch's mean and
// unbiased variance and counts the batch; eval mode uses them and changes nothing.
TEST(BatchNorm2dModule, TrainingUpdatesRunningStatisticsAsPyTorch) {
  nn::BatchNorm2d bn(2, 1e-5, 0.25);
  // Channel 0 holds 1..8, channel 1 holds 10 x (1..8), over N = 2 and 2 x 2 pixels.
  std::vector<float> values(16);
  for (int n = 0; n < 2; ++n)
    for (int c = 0; c < 2; ++c)
      for (int p = 0; p < 4; ++p) values[(n * 2 + c) * 4 + p] = (c == 0 ? 1.0f : 10.0f) * (n * 4 + p + 1);
  Tensor x = from_vector<float>(values, {2, 2, 2, 2});
  bn.forward(x);
  // mean 4.5 and unbiased variance 6 (sum of squares 42 over 7) for 1..8.
  const std::vector<float> mean = bn.running_mean.to_vector<float>(), var = bn.running_var.to_vector<float>();
  EXPECT_NEAR(mean[0], 0.25 * 4.5, 1e-5);
  EXPECT_NEAR(mean[1], 0.25 * 45.0, 1e-4);
  EXPECT_NEAR(var[0], 0.75 + 0.25 * 6.0, 1e-5);
  EXPECT_NEAR(var[1], 0.75 + 0.25 * 600.0, 1e-3);
  EXPECT_EQ(bn.num_batches_tracked.to_vector<int64_t>(), std::vector<int64_t>{1});

  bn.eval();
  NoGradGuard no_grad;
  Tensor y = bn.forward(x);
  EXPECT_EQ(bn.num_batches_tracked.to_vector<int64_t>(), std::vector<int64_t>{1});
  EXPECT_EQ(bn.running_mean.to_vector<float>(), mean);
  EXPECT_NEAR(y.to_vector<float>()[0], (1.0 - mean[0]) / std::sqrt(var[0] + 1e-5), 1e-5);
}

TEST(Conv2dModule, PyTorchDefaultInitialisationAndShapes) {
  nn::Conv2d conv(4, 8, {.kernel = 3, .stride = 2, .padding = 1});
  EXPECT_EQ(conv.weight.shape(), (Shape{8, 4, 3, 3}));
  EXPECT_EQ(conv.bias.shape(), (Shape{8}));
  const double bound = 1.0 / std::sqrt(4.0 * 9.0);
  for (float w : conv.weight.to_vector<float>()) EXPECT_LE(std::abs(w), bound);
  for (float b : conv.bias.to_vector<float>()) EXPECT_LE(std::abs(b), bound);
  EXPECT_EQ(conv.forward(randn({2, 4, 9, 9})).shape(), (Shape{2, 8, 5, 5}));
  nn::Conv2d plain(4, 8, {.kernel = 1, .bias = false});
  EXPECT_FALSE(plain.bias.defined());
  EXPECT_EQ(plain.named_parameters().size(), 1u);
}

TEST(PoolAndFlattenModules, ShapesAndLogicalOrder) {
  Tensor x = randn({2, 3, 4, 4});
  EXPECT_EQ(nn::MaxPool2d(2).forward(x).shape(), (Shape{2, 3, 2, 2}));
  EXPECT_EQ(nn::AvgPool2d(3, 1, 1).forward(x).shape(), (Shape{2, 3, 4, 4}));
  EXPECT_EQ(nn::AdaptiveAvgPool2d({1, 1}).forward(x).shape(), (Shape{2, 3, 1, 1}));
  // Flatten reads in NCHW order whatever the memory layout.
  Tensor nhwc = ops::to_memory_format(x, ops::MemoryFormat::channels_last);
  EXPECT_EQ(nn::Flatten().forward(nhwc).to_vector<float>(), nn::Flatten().forward(x).to_vector<float>());
  EXPECT_EQ(nn::Flatten().forward(x).shape(), (Shape{2, 48}));
  std::vector<float> r = nn::ReLU().forward(from_vector<float>({-1.0f, 2.0f}, {2})).to_vector<float>();
  EXPECT_EQ(r, (std::vector<float>{0.0f, 2.0f}));
}

// Flatten's gradient against central differences, from an NCHW input and from a channels-last
// one (whose gradient must come back in NCHW order through the layout change).
TEST(PoolAndFlattenModules, FlattenGradientMatchesFiniteDifferences) {
  for (const auto format : {ops::MemoryFormat::contiguous, ops::MemoryFormat::channels_last}) {
    precis::testing::expect_gradients_match(
        [format](const std::vector<Tensor>& in) { return nn::Flatten().forward(ops::to_memory_format(in[0], format)); },
        {precis::testing::random_f64({2, 3, 4, 5}, 17)});
  }
}
