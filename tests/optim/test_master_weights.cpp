#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "core/copy.h"
#include "core/random.h"
#include "optim/adamw.h"
#include "optim/low_precision.h"
#include "optim/sgd.h"

using namespace precis;

namespace {

// A low-precision leaf holding `values` rounded to nearest-even.
Tensor low_precision_param(const Tensor& values, DType dtype) { return values.to(dtype).set_requires_grad(); }

// An f32 leaf with exactly the values of `param`.
Tensor f32_copy(const Tensor& param) { return param.detach().to(DType::f32).set_requires_grad(); }

std::vector<float> rounded(const std::vector<float>& values, DType dtype) {
  std::vector<float> out;
  for (float v : values)
    out.push_back(dtype == DType::bf16 ? static_cast<float>(bfloat16(v)) : static_cast<float>(half(v)));
  return out;
}

// The two bf16 values around x (equal when x is one).
std::pair<float, float> bf16_neighbours(float x) {
  float nearest = static_cast<float>(bfloat16(x));
  float other = nearest;
  if (nearest != x) {
    uint16_t bits = Eigen::numext::bit_cast<uint16_t>(bfloat16(x));
    bool away = std::abs(nearest) > std::abs(x);
    other = static_cast<float>(Eigen::numext::bit_cast<bfloat16>(static_cast<uint16_t>(away ? bits - 1 : bits + 1)));
  }
  return {std::min(nearest, other), std::max(nearest, other)};
}

// Runs `steps` steps of make_optimizer(param) on a low-precision parameter and on an
// f32 reference with the same gradients, checking after every step that the
// master equals the reference exactly and the parameter is the master rounded.
template <typename MakeOptimizer>
void expect_master_tracks_f32_reference(DType param_dtype, DType grad_dtype, MakeOptimizer make_optimizer) {
  Generator gen(11);
  const int64_t n = 40000;  // above the parallel grain: the threaded loop runs
  Tensor p = low_precision_param(rand({n}, DType::f32, &gen, -2, 2), param_dtype);
  Tensor ref = f32_copy(p);
  auto opt = make_optimizer(p);
  auto ref_opt = make_optimizer(ref);
  for (int t = 0; t < 12; ++t) {
    Tensor g = rand({n}, DType::f32, &gen, -1, 1).to(grad_dtype);
    p.set_grad(g);
    ref.set_grad(g.to(DType::f32));
    opt.step();
    ref_opt.step();
    Tensor master = opt.master(0);
    ASSERT_TRUE(master.defined());
    ASSERT_EQ(master.dtype(), DType::f32);
    std::vector<float> m = master.to_vector<float>();
    ASSERT_EQ(m, ref.to_vector<float>()) << "step " << t;
    ASSERT_EQ(p.to_vector<float>(), rounded(m, param_dtype)) << "step " << t;
  }
}

}  // namespace

TEST(MasterWeights, AdamWMasterEqualsAnF32RunExactly) {
  optim::AdamWOptions options{.lr = 1e-2, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8};
  auto make = [&](Tensor& p) { return optim::AdamW({{{p}, 0.1}}, options); };
  expect_master_tracks_f32_reference(DType::bf16, DType::f32, make);
  expect_master_tracks_f32_reference(DType::bf16, DType::bf16, make);
  expect_master_tracks_f32_reference(DType::f16, DType::f32, make);
}

TEST(MasterWeights, SGDMasterEqualsAnF32RunExactly) {
  optim::SGDOptions options{.lr = 0.05, .momentum = 0.9, .nesterov = true};
  auto make = [&](Tensor& p) { return optim::SGD({{{p}, 0.01}}, options); };
  expect_master_tracks_f32_reference(DType::bf16, DType::f32, make);
  expect_master_tracks_f32_reference(DType::f16, DType::f16, make);
}

TEST(MasterWeights, WithoutMasterWeightsSmallUpdatesAreLost) {
  // lr * g = 1e-3 is below half a bf16 step at 1 (2^-9): rounding the updated parameter
  // to nearest-even gives back 1 every step, while the master accumulates the updates.
  Tensor plain = low_precision_param(full({4}, 1.0), DType::bf16);
  Tensor kept = low_precision_param(full({4}, 1.0), DType::bf16);
  optim::SGD plain_opt({{{plain}, 0.0}}, {.lr = 1e-3, .master_weights = false});
  optim::SGD kept_opt({{{kept}, 0.0}}, {.lr = 1e-3});
  for (int t = 0; t < 10; ++t) {
    plain.set_grad(full({4}, 1.0));
    kept.set_grad(full({4}, 1.0));
    plain_opt.step();
    kept_opt.step();
  }
  EXPECT_EQ(plain.to_vector<float>(), std::vector<float>(4, 1.0f));
  EXPECT_FALSE(plain_opt.master(0).defined());
  EXPECT_EQ(plain_opt.state_dict().count("state.0.master"), 0u);
  float master = kept_opt.master(0).to_vector<float>()[0];
  EXPECT_NEAR(master, 0.99f, 1e-6);
  EXPECT_EQ(kept.to_vector<float>(), std::vector<float>(4, static_cast<float>(bfloat16(master))));

  // Without a master, one AdamW step is the f32 update of the widened parameter, rounded.
  Tensor p = low_precision_param(tensor({0.5, -3.0, 7.0}), DType::bf16);
  optim::AdamW adamw({{{p}, 0.1}}, {.lr = 0.25, .master_weights = false});
  p.set_grad(tensor({1.0, -2.0, 0.0}));
  adamw.step();
  std::vector<float> expected;
  for (auto [x, g] : {std::pair{0.5f, 1.0f}, {-3.0f, -2.0f}, {7.0f, 0.0f}}) {
    // The f32 operations of the update at step 1.
    const double bias1 = 1.0 - 0.9, bias2 = 1.0 - 0.999;
    float m = (1 - 0.9f) * g, v = (1 - 0.999f) * g * g;
    float update = static_cast<float>(0.25 / bias1) * m /
                   (std::sqrt(v) * static_cast<float>(1 / std::sqrt(bias2)) + static_cast<float>(1e-8));
    expected.push_back(static_cast<float>(bfloat16(x * static_cast<float>(1 - 0.25 * 0.1) - update)));
  }
  std::vector<float> got = p.to_vector<float>();
  for (size_t i = 0; i < expected.size(); ++i) EXPECT_EQ(got[i], expected[i]) << i;
}

TEST(StochasticRounding, GivesOneOfTheTwoNeighbours) {
  Generator gen(3);
  std::vector<float> xs = rand({20000}, DType::f32, &gen, -100, 100).to_vector<float>();
  xs.insert(xs.end(), {1.0f, -2.5f, 0.0f, 3.0e38f});
  for (size_t i = 0; i < xs.size(); ++i) {
    float x = xs[i];
    auto [low, high] = bf16_neighbours(x);
    for (uint32_t r : {0u, 1u, 0x7FFFu, 0x8000u, 0xFFFFu, static_cast<uint32_t>((i * 2654435761u) & 0xFFFFu)}) {
      float y = static_cast<float>(Eigen::numext::bit_cast<bfloat16>(optim::bf16_bits_stochastic(x, r)));
      ASSERT_TRUE(y == low || y == high) << x << " rounded with bits " << r << " to " << y;
    }
    float truncated = static_cast<float>(Eigen::numext::bit_cast<bfloat16>(optim::bf16_bits_stochastic(x, 0)));
    ASSERT_EQ(std::abs(truncated), std::abs(x) > 0 ? std::min(std::abs(low), std::abs(high)) : 0.0f) << x;
  }
  EXPECT_TRUE(std::isinf(static_cast<float>(
      Eigen::numext::bit_cast<bfloat16>(optim::bf16_bits_stochastic(std::numeric_limits<float>::infinity(), 0xFFFF)))));
  EXPECT_TRUE(std::isnan(static_cast<float>(
      Eigen::numext::bit_cast<bfloat16>(optim::bf16_bits_stochastic(std::numeric_limits<float>::quiet_NaN(), 0)))));
}

TEST(StochasticRounding, IsUnbiasedOnAverage) {
  const float ulp = 1.0f / 128;  // bf16 spacing in [1, 2)
  for (float fraction : {0.3f, 0.5f, 0.9f}) {
    for (float sign : {1.0f, -1.0f}) {
      const float x = sign * (1.0f + fraction * ulp);
      optim::Rounding rounding{.stochastic = true, .seed = 42, .step = 7, .param_index = 2};
      const int n = 200000;
      double sum = 0;
      std::set<float> seen;
      for (int i = 0; i < n; ++i) {
        float y = static_cast<float>(optim::round_to<bfloat16>(x, rounding, i));
        sum += y;
        seen.insert(y);
      }
      EXPECT_EQ(seen.size(), 2u);
      // The standard deviation of the mean is at most ulp / (2 sqrt(n)) ~ 9e-6.
      EXPECT_NEAR(sum / n, x, 5e-5) << "fraction " << fraction << " sign " << sign;
    }
  }
}

TEST(StochasticRounding, OptimizerStepsAreDeterministicPerSeedAndKeepTheMasterExact) {
  auto run = [](uint64_t seed) {
    Generator gen(5);
    Tensor p = low_precision_param(rand({1000}, DType::f32, &gen, -1, 1), DType::bf16);
    Tensor ref = f32_copy(p);
    optim::AdamW opt({{{p}, 0.0}}, {.lr = 1e-3, .stochastic_rounding = true, .seed = seed});
    optim::AdamW ref_opt({{{ref}, 0.0}}, {.lr = 1e-3});
    for (int t = 0; t < 5; ++t) {
      Tensor g = rand({1000}, DType::f32, &gen, -1, 1);
      p.set_grad(g);
      ref.set_grad(g.clone());
      opt.step();
      ref_opt.step();
    }
    std::vector<float> master = opt.master(0).to_vector<float>(), values = p.to_vector<float>();
    EXPECT_EQ(master, ref.to_vector<float>());
    for (size_t i = 0; i < values.size(); ++i) {
      auto [low, high] = bf16_neighbours(master[i]);
      EXPECT_TRUE(values[i] == low || values[i] == high) << i;
    }
    return values;
  };
  std::vector<float> a = run(1), b = run(1), c = run(2);
  EXPECT_EQ(a, b);
  int differing = 0;
  for (size_t i = 0; i < a.size(); ++i) differing += a[i] != c[i];
  EXPECT_GT(differing, 100);  // different seeds round many elements differently
}

TEST(StochasticRounding, KeepsPureBf16TrainingProgressingWithoutMaster) {
  // lr * g = 1e-3 per step, a quarter of a bf16 step below 1: nearest-even never moves,
  // stochastic rounding moves by the right amount on average.
  const int64_t n = 10000;
  Tensor nearest = low_precision_param(full({n}, 1.0), DType::bf16);
  Tensor stochastic = low_precision_param(full({n}, 1.0), DType::bf16);
  optim::SGD nearest_opt({{{nearest}, 0.0}}, {.lr = 1e-3, .master_weights = false});
  optim::SGD stochastic_opt({{{stochastic}, 0.0}},
                            {.lr = 1e-3, .master_weights = false, .stochastic_rounding = true, .seed = 9});
  for (int t = 0; t < 100; ++t) {
    nearest.set_grad(full({n}, 1.0));
    stochastic.set_grad(full({n}, 1.0));
    nearest_opt.step();
    stochastic_opt.step();
  }
  for (float v : nearest.to_vector<float>()) ASSERT_EQ(v, 1.0f);
  double mean = 0;
  for (float v : stochastic.to_vector<float>()) mean += v / n;
  EXPECT_NEAR(mean, 0.9, 2e-3);
}

TEST(StochasticRounding, RejectsFloat16Parameters) {
  Tensor p = low_precision_param(full({2}, 1.0), DType::f16);
  optim::AdamW opt({{{p}, 0.0}}, {.stochastic_rounding = true});
  p.set_grad(full({2}, 1.0));
  try {
    opt.step();
    FAIL() << "stochastic rounding ran on float16";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("stochastic_rounding is for bfloat16 parameters, but parameter 0 is float16"),
              std::string::npos)
        << e.what();
  }
}

TEST(MasterWeights, StateDictRoundTripIncludesTheMaster) {
  Generator gen(8);
  Tensor a = low_precision_param(rand({64}, DType::f32, &gen, -1, 1), DType::bf16);
  Tensor b = low_precision_param(full({64}, 0.0), DType::bf16);
  optim::AdamWOptions options{.lr = 1e-2, .stochastic_rounding = true, .seed = 4};
  optim::AdamW oa({{{a}, 0.1}}, options), ob({{{b}, 0.1}}, options);
  std::vector<Tensor> grads;
  for (int t = 0; t < 5; ++t) grads.push_back(rand({64}, DType::f32, &gen, -1, 1));
  for (int t = 0; t < 3; ++t) {
    a.set_grad(grads[t]);
    oa.step();
  }
  auto state = oa.state_dict();
  ASSERT_EQ(state.count("state.0.master"), 1u);
  EXPECT_EQ(state.at("state.0.master").dtype(), DType::f32);
  ob.load_state_dict(state);
  copy_(b, a);
  EXPECT_EQ(ob.master(0).to_vector<float>(), oa.master(0).to_vector<float>());
  for (int t = 3; t < 5; ++t) {
    a.set_grad(grads[t]);
    b.set_grad(grads[t]);
    oa.step();
    ob.step();
  }
  EXPECT_EQ(ob.master(0).to_vector<float>(), oa.master(0).to_vector<float>());
  EXPECT_EQ(b.to_vector<float>(), a.to_vector<float>());

  // A master copy belongs to a low-precision parameter.
  Tensor f32_param = full({64}, 0.0).set_requires_grad();
  optim::AdamW of({{{f32_param}, 0.1}}, options);
  try {
    of.load_state_dict(state);
    FAIL() << "loaded a master copy for a float32 parameter";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'state.0.master' is a float32 master copy but parameter 0 is float32"),
              std::string::npos)
        << e.what();
  }
}

// f32, f16 and bf16 gradients go with f32, f16 and bf16 parameters (ZeRO-1 reads a bf16 or f16
// reduce as it is, distributed/zero.h); an f64 gradient only with an f64 parameter.
TEST(MasterWeights, MismatchedGradientDtypesAreErrors) {
  Tensor p = low_precision_param(full({2}, 1.0), DType::bf16);
  optim::AdamW opt({{{p}, 0.0}});
  p.set_grad(full({2}, 1.0, DType::f64));
  try {
    opt.step();
    FAIL() << "a bf16 parameter took an f64 gradient";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("parameter 0 is bfloat16 with a float64 gradient"), std::string::npos)
        << e.what();
  }
}
