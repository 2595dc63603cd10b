// The optimizers on parameters laid out channels-last (nn::to_channels_last): the update pairs
// a parameter, its gradient and its state element by element in memory, so with the state made
// in the parameter's layout a channels-last run equals a row-major one exactly (the same
// arithmetic per element). Its state reads row-major (as a checkpoint writes it) with the
// same values, loads into either layout, and a gradient in another layout than its parameter's
// is an error.
#include <gtest/gtest.h>

#include <functional>
#include <memory>

#include "core/autograd.h"
#include "core/copy.h"
#include "ops/memory_format.h"
#include "optim/adamw.h"
#include "optim/sgd.h"
#include "support/errors.h"
#include "support/gradcheck.h"

using namespace precis;
using precis::testing::expect_error;
using precis::testing::random_f64;

namespace {

const Shape kWeight{4, 3, 3, 3}, kBias{5};

// A leaf of `values` converted to `dtype`, channels-last when asked (4-D only).
Tensor leaf(const Tensor& values, DType dtype, bool channels_last) {
  Tensor t = values.dim() == 4 && channels_last
                 ? ops::empty_in(values.shape(), ops::MemoryFormat::channels_last, dtype, Device::cpu())
                 : empty(values.shape(), dtype);
  copy_(t, values);
  return t.set_requires_grad();
}

// `values` as a gradient laid out as `param`.
Tensor grad_like(const Tensor& param, const Tensor& values) {
  Tensor g = empty_with_layout_of(param, DType::f32);
  copy_(g, values);
  return g;
}

using MakeOptimizer = std::function<std::unique_ptr<optim::Optimizer>(std::vector<Tensor>)>;

struct Run {
  Run(DType dtype, bool channels_last, const MakeOptimizer& make) {
    params = {leaf(random_f64(kWeight, 1), dtype, channels_last), leaf(random_f64(kBias, 2), dtype, channels_last)};
    optimizer = make(params);
  }
  void step(int t) {
    for (size_t i = 0; i < params.size(); ++i)
      params[i].set_grad(grad_like(params[i], random_f64(params[i].shape(), 100 + 10 * t + i)));
    optimizer->step();
  }
  std::vector<Tensor> params;
  std::unique_ptr<optim::Optimizer> optimizer;
};

void expect_same_values(const std::vector<Tensor>& a, const std::vector<Tensor>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i].to_vector<double>(), b[i].to_vector<double>()) << "tensor " << i;
}

void expect_same_state(const optim::Optimizer& a, const optim::Optimizer& b) {
  const auto sa = a.state_dict(), sb = b.state_dict();
  ASSERT_EQ(sa.size(), sb.size());
  for (const auto& [key, value] : sa) {
    ASSERT_TRUE(sb.count(key)) << key;
    EXPECT_EQ(value.to_vector<double>(), sb.at(key).to_vector<double>()) << key;
  }
}

// 4 steps in both layouts: the same parameters and state; then each run's state loaded into
// a fresh run of the other layout continues as the original run does, exactly.
void expect_layouts_agree(DType dtype, const MakeOptimizer& make) {
  Run row_major(dtype, false, make), channels_last(dtype, true, make);
  for (int t = 0; t < 4; ++t) row_major.step(t), channels_last.step(t);
  EXPECT_EQ(channels_last.params[0].strides(), (Shape{27, 1, 9, 3}));
  expect_same_values(channels_last.params, row_major.params);
  expect_same_state(*channels_last.optimizer, *row_major.optimizer);
  for (const auto& [key, value] : channels_last.optimizer->state_dict()) {
    if (key.starts_with("state.0.")) {
      EXPECT_EQ(value.strides(), (Shape{27, 1, 9, 3})) << key << ": the param's layout";
    }
  }

  for (bool into_channels_last : {true, false}) {
    Run original(dtype, !into_channels_last, make), resumed(dtype, into_channels_last, make);
    for (int t = 0; t < 4; ++t) original.step(t);
    {
      NoGradGuard no_grad;
      for (size_t i = 0; i < resumed.params.size(); ++i) copy_(resumed.params[i], original.params[i]);
    }
    resumed.optimizer->load_state_dict(original.optimizer->state_dict());
    for (int t = 4; t < 7; ++t) original.step(t), resumed.step(t);
    expect_same_values(resumed.params, original.params);
    expect_same_state(*resumed.optimizer, *original.optimizer);
  }
}

}  // namespace

TEST(ChannelsLastParams, AdamWWithMasterWeightsMatchesRowMajorExactly) {
  expect_layouts_agree(DType::bf16, [](std::vector<Tensor> p) {
    return std::make_unique<optim::AdamW>(std::vector<optim::ParamGroup>{{p, 0.1}}, optim::AdamWOptions{.lr = 1e-2});
  });
}

TEST(ChannelsLastParams, AdamWInF32MatchesRowMajorExactly) {
  expect_layouts_agree(DType::f32, [](std::vector<Tensor> p) {
    return std::make_unique<optim::AdamW>(std::vector<optim::ParamGroup>{{p, 0.1}}, optim::AdamWOptions{.lr = 1e-2});
  });
}

TEST(ChannelsLastParams, SgdWithMomentumMatchesRowMajorExactly) {
  expect_layouts_agree(DType::bf16, [](std::vector<Tensor> p) {
    return std::make_unique<optim::SGD>(std::vector<optim::ParamGroup>{{p, 0.01}},
                                        optim::SGDOptions{.lr = 0.1, .momentum = 0.9, .nesterov = true});
  });
}

TEST(ChannelsLastParams, AGradientInAnotherLayoutIsAnError) {
  Tensor w = leaf(random_f64(kWeight, 1), DType::f32, true);
  w.set_grad(random_f64(kWeight, 2).to(DType::f32));  // row-major
  optim::AdamW adamw({{{w}, 0.0}});
  expect_error([&] { adamw.step(); }, "AdamW: parameter 0 and its gradient must be dense in one layout");
  optim::SGD sgd({{{w}, 0.0}});
  expect_error([&] { sgd.step(); }, "SGD: parameter 0 and its gradient must be dense in one layout");
}
