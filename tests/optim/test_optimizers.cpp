#include <gtest/gtest.h>

#include <cmath>

#include "core/copy.h"
#include "optim/adamw.h"
#include "optim/clip_grad.h"
#include "optim/lr_schedule.h"
#include "optim/sgd.h"
#include "support/gradcheck.h"

using namespace precis;
using precis::testing::expect_close;

namespace {
Tensor param(std::initializer_list<double> v) { return tensor(v, DType::f64).set_requires_grad(); }
void set_grad(Tensor& p, std::initializer_list<double> g) { p.set_grad(tensor(g, DType::f64)); }
}  // namespace

TEST(AdamW, MatchesTheFormulaOverThreeSteps) {
  const double lr = 0.1, b1 = 0.9, b2 = 0.99, eps = 1e-8, wd = 0.1;
  Tensor p = param({1.0, -2.0, 0.5});
  optim::AdamW opt({{{p}, wd}}, {lr, b1, b2, eps});
  std::vector<double> ref = {1.0, -2.0, 0.5}, m(3, 0), v(3, 0);
  std::vector<std::vector<double>> grads = {{0.1, -0.2, 0.3}, {0.5, 0.0, -1.0}, {-0.3, 0.2, 0.1}};
  for (int t = 1; t <= 3; ++t) {
    set_grad(p, {grads[t - 1][0], grads[t - 1][1], grads[t - 1][2]});
    opt.step();
    for (int i = 0; i < 3; ++i) {
      double g = grads[t - 1][i];
      ref[i] *= 1 - lr * wd;
      m[i] = b1 * m[i] + (1 - b1) * g;
      v[i] = b2 * v[i] + (1 - b2) * g * g;
      double mhat = m[i] / (1 - std::pow(b1, t)), vhat = v[i] / (1 - std::pow(b2, t));
      ref[i] -= lr * mhat / (std::sqrt(vhat) + eps);
    }
  }
  expect_close(p, from_vector(ref, {3}), 1e-12, 1e-12);
  EXPECT_EQ(opt.step_count(), 3);
}

TEST(AdamW, StateRoundTripContinuesIdentically) {
  Tensor a = param({1.0, 2.0}), b = param({1.0, 2.0});
  optim::AdamW oa({{{a}, 0.0}}, {0.01}), ob({{{b}, 0.0}}, {0.01});
  set_grad(a, {0.3, -0.1});
  oa.step();
  ob.load_state_dict(oa.state_dict());
  copy_(b, a);
  set_grad(a, {0.2, 0.4});
  set_grad(b, {0.2, 0.4});
  oa.step();
  ob.step();
  expect_close(b, a, 0, 0);
  EXPECT_THROW(ob.load_state_dict({}), Error);
}

TEST(SGD, MomentumAndNesterovMatchTorchFormulas) {
  Tensor p = param({1.0}), q = param({1.0});
  optim::SGD plain({{{p}, 0.5}}, {.lr = 0.1, .momentum = 0.9});
  optim::SGD nesterov({{{q}, 0.0}}, {.lr = 0.1, .momentum = 0.9, .nesterov = true});
  // plain, wd 0.5: d1 = 1 + 0.5 = 1.5, buf = 1.5, p = 1 - 0.15 = 0.85
  set_grad(p, {1.0});
  plain.step();
  EXPECT_NEAR(p.item(), 0.85, 1e-12);
  // d2 = 1 + 0.425 = 1.425, buf = 0.9*1.5 + 1.425 = 2.775, p = 0.85 - 0.2775
  set_grad(p, {1.0});
  plain.step();
  EXPECT_NEAR(p.item(), 0.85 - 0.2775, 1e-12);
  // nesterov: buf = 1, d = 1 + 0.9 = 1.9, q = 1 - 0.19
  set_grad(q, {1.0});
  nesterov.step();
  EXPECT_NEAR(q.item(), 0.81, 1e-12);
  EXPECT_THROW(optim::SGD({{{param({1.0})}, 0.0}}, {.lr = 0.1, .nesterov = true}), Error);
}

TEST(ClipGradNorm, ScalesToMaxNormAndReportsTheOriginal) {
  Tensor a = param({3.0}), b = param({0.0, 4.0});
  set_grad(a, {3.0});
  set_grad(b, {0.0, 4.0});
  double norm = optim::clip_grad_norm({a, b}, 1.0);
  EXPECT_DOUBLE_EQ(norm, 5.0);
  EXPECT_NEAR(a.grad().item(), 3.0 / (5.0 + 1e-6), 1e-12);
  EXPECT_NEAR(b.grad().to_vector<double>()[1], 4.0 / (5.0 + 1e-6), 1e-12);
  EXPECT_NEAR(optim::clip_grad_norm({a, b}, 10.0), 1.0, 1e-6);  // under the limit: unchanged
  EXPECT_NEAR(a.grad().item(), 3.0 / (5.0 + 1e-6), 1e-12);
}

TEST(LrSchedule, WarmupThenCosineToMin) {
  optim::LrSchedule s{"cosine", 1.0, 0.1, 10, 110};
  EXPECT_DOUBLE_EQ(s.at(0), 1.0 / 11);
  EXPECT_DOUBLE_EQ(s.at(9), 10.0 / 11);
  EXPECT_DOUBLE_EQ(s.at(10), 1.0);
  EXPECT_NEAR(s.at(60), 0.55, 1e-12);  // halfway: min + 0.5 (max - min)
  EXPECT_DOUBLE_EQ(s.at(110), 0.1);
  EXPECT_DOUBLE_EQ(s.at(500), 0.1);
  EXPECT_DOUBLE_EQ((optim::LrSchedule{"constant", 0.3}).at(1000), 0.3);
  EXPECT_THROW((optim::LrSchedule{"linear"}).at(0), Error);
}
