// The optimizers' and clip_grad_norm's cases, parameterised over the device
// (tests/support/devices.h): AdamW and SGD against a plain f64 reference of their
// formulas written here (with the gradient factor and a skipped step), the saved state,
// clip_grad_norm against a direct f64 norm, and the compute copies (each step's weights cast
// into f16/bf16 by the optimizer) against a cast. Instantiated for the CPU by
// test_optimizers.cpp and for the GPU by test_optimizers_gpu.cpp.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "core/copy.h"
#include "ops/memory_format.h"
#include "optim/adamw.h"
#include "optim/clip_grad.h"
#include "optim/sgd.h"
#include "support/devices.h"
#include "support/errors.h"
#include "support/gradcheck.h"

namespace optimizer_cases {

using namespace precis;
using precis::testing::expect_close;
using precis::testing::random_f64;

class OptimizerOn : public precis::testing::OnDevice {
 protected:
  Tensor param(std::initializer_list<double> v) const { return tensor(v, DType::f64).to(device()).set_requires_grad(); }
  void set_grad(Tensor& p, const std::vector<double>& g) const {
    p.set_grad(from_vector(g, {static_cast<int64_t>(g.size())}).to(device()));
  }
  Tensor scalar(double v) const { return scalar_tensor(v, DType::f64, device()); }
};

// AdamW for one f64 element, the formula of optim/adamw.h.
struct AdamWReference {
  double lr, b1, b2, eps, wd;
  double x, m = 0, v = 0;
  int t = 0;
  void step(double g) {
    ++t;
    x *= 1 - lr * wd;
    m = b1 * m + (1 - b1) * g;
    v = b2 * v + (1 - b2) * g * g;
    const double mhat = m / (1 - std::pow(b1, t)), vhat = v / (1 - std::pow(b2, t));
    x -= lr * mhat / (std::sqrt(vhat) + eps);
  }
};

// SGD for one f64 element, the formula of optim/sgd.h.
struct SGDReference {
  double lr, momentum, dampening, wd;
  bool nesterov;
  double x, buf = 0;
  int t = 0;
  void step(double g) {
    ++t;
    double d = g + wd * x;
    if (momentum > 0) {
      buf = t == 1 ? d : momentum * buf + (1 - dampening) * d;
      d = nesterov ? d + momentum * buf : buf;
    }
    x -= lr * d;
  }
};

TEST_P(OptimizerOn, AdamWMatchesTheFormulaOverThreeSteps) {
  const double lr = 0.1, b1 = 0.9, b2 = 0.99, eps = 1e-8, wd = 0.1;
  Tensor p = param({1.0, -2.0, 0.5});
  optim::AdamW opt({{{p}, wd}}, {lr, b1, b2, eps});
  EXPECT_EQ(opt.device(), device());
  std::vector<AdamWReference> ref;
  for (double x : {1.0, -2.0, 0.5}) ref.push_back({lr, b1, b2, eps, wd, x});
  std::vector<std::vector<double>> grads = {{0.1, -0.2, 0.3}, {0.5, 0.0, -1.0}, {-0.3, 0.2, 0.1}};
  for (int t = 1; t <= 3; ++t) {
    set_grad(p, grads[t - 1]);
    opt.step();
    for (int i = 0; i < 3; ++i) ref[i].step(grads[t - 1][i]);
  }
  expect_close(p.to(Device::cpu()), from_vector(std::vector<double>{ref[0].x, ref[1].x, ref[2].x}, {3}), 1e-12, 1e-12);
  EXPECT_EQ(opt.step_count(), 3);
}

// The gradient factor multiplies each gradient as it is read (the gradient itself stays);
// a skipped step changes nothing, the step count included; the learning rate changes per step.
TEST_P(OptimizerOn, AdamWAppliesTheGradientFactorAndSkipsFlaggedSteps) {
  const double b1 = 0.9, b2 = 0.95, eps = 1e-8, wd = 0.1;
  Tensor p = param({1.0, -2.0, 0.5});
  optim::AdamW opt({{{p}, wd}}, {0.01, b1, b2, eps});
  std::vector<AdamWReference> ref;
  for (double x : {1.0, -2.0, 0.5}) ref.push_back({0.01, b1, b2, eps, wd, x});
  const std::vector<double> factors = {0.5, 1.0, 0.25, 2.0, 0.125};
  for (int step = 0; step < 5; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    const bool skipped = step == 2;
    const double lr = 0.01 * (step + 1);
    const std::vector<double> g = {0.3 - step, 0.1 * step, -0.7};
    set_grad(p, g);
    opt.set_lr(lr);
    const Tensor before = p.to(Device::cpu()).clone();
    opt.step({.grad_factor = scalar(factors[step]), .skip_if = scalar(skipped ? 1.0 : 0.0)});
    expect_close(p.grad().to(Device::cpu()), from_vector(g, {3}), 0, 0);
    if (skipped) {
      expect_close(p.to(Device::cpu()), before, 0, 0);
      continue;
    }
    for (int i = 0; i < 3; ++i) {
      ref[i].lr = lr;
      ref[i].step(g[i] * factors[step]);
    }
  }
  expect_close(p.to(Device::cpu()), from_vector(std::vector<double>{ref[0].x, ref[1].x, ref[2].x}, {3}), 1e-12, 1e-12);
  EXPECT_EQ(opt.step_count(), 4) << "the skipped step does not count";
  EXPECT_EQ(opt.state_dict().at("step").item<int64_t>(), 4);
}

TEST_P(OptimizerOn, AdamWStateRoundTripContinuesIdentically) {
  Tensor a = param({1.0, 2.0}), b = param({1.0, 2.0});
  optim::AdamW oa({{{a}, 0.0}}, {0.01}), ob({{{b}, 0.0}}, {0.01});
  set_grad(a, {0.3, -0.1});
  oa.step();
  ob.load_state_dict(oa.state_dict());
  EXPECT_EQ(ob.step_count(), 1);
  copy_(b, a);
  set_grad(a, {0.2, 0.4});
  set_grad(b, {0.2, 0.4});
  oa.step();
  ob.step();
  expect_close(b.to(Device::cpu()), a.to(Device::cpu()), 0, 0);
  EXPECT_THROW(ob.load_state_dict({}), Error);
}

TEST_P(OptimizerOn, SGDMomentumAndNesterovMatchTorchFormulas) {
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

// SGD with momentum (plain, dampened, Nesterov) and weight decay, a gradient factor, a
// changing learning rate and a skipped first step (the next one is then the first: the
// momentum buffer starts from it), against the f64 reference.
TEST_P(OptimizerOn, SGDAppliesTheGradientFactorAndSkipsFlaggedSteps) {
  struct Case {
    double momentum, dampening;
    bool nesterov;
  };
  for (const Case& c : {Case{0.0, 0.0, false}, Case{0.9, 0.0, false}, Case{0.9, 0.3, false}, Case{0.8, 0.0, true}}) {
    SCOPED_TRACE("momentum " + std::to_string(c.momentum) + " dampening " + std::to_string(c.dampening) +
                 (c.nesterov ? " nesterov" : ""));
    const double wd = 0.05;
    Tensor p = param({1.0, -2.0, 0.5});
    optim::SGD opt({{{p}, wd}}, {.lr = 0.1, .momentum = c.momentum, .dampening = c.dampening, .nesterov = c.nesterov});
    std::vector<SGDReference> ref;
    for (double x : {1.0, -2.0, 0.5}) ref.push_back({0.1, c.momentum, c.dampening, wd, c.nesterov, x});
    const std::vector<double> factors = {0.5, 0.25, 1.0, 2.0, 0.125};
    for (int step = 0; step < 5; ++step) {
      const bool skipped = step == 0;
      const double lr = 0.05 * (step + 1);
      const std::vector<double> g = {0.3 - step, 0.1 * step, -0.7};
      set_grad(p, g);
      opt.set_lr(lr);
      opt.step({.grad_factor = scalar(factors[step]), .skip_if = scalar(skipped ? 1.0 : 0.0)});
      if (skipped) continue;
      for (int i = 0; i < 3; ++i) {
        ref[i].lr = lr;
        ref[i].step(g[i] * factors[step]);
      }
    }
    expect_close(p.to(Device::cpu()), from_vector(std::vector<double>{ref[0].x, ref[1].x, ref[2].x}, {3}), 1e-12,
                 1e-12);
    EXPECT_EQ(opt.step_count(), 4);
  }
}

// {norm, factor} against a direct f64 norm: under and over the limit, with a loss scale the
// gradients carry (the norm and factor take it out) and the overflow flag it sets.
TEST_P(OptimizerOn, ClipGradNormReturnsTheNormAndTheFactor) {
  Tensor a = param({3.0}), b = param({0.0, 4.0});
  set_grad(a, {3.0});
  set_grad(b, {0.0, 4.0});
  const double norm = std::sqrt(3.0 * 3.0 + 4.0 * 4.0);
  Tensor r = optim::clip_grad_norm({a, b}, 1.0);
  ASSERT_EQ(r.device(), device());
  std::vector<double> v = r.to_vector<double>();
  EXPECT_DOUBLE_EQ(v[0], norm);
  EXPECT_DOUBLE_EQ(v[1], 1.0 / (norm + 1e-6));
  EXPECT_EQ(a.grad().item(), 3.0) << "the gradients are not changed: the optimizer applies the factor";
  v = optim::clip_grad_norm({a, b}, 10.0).to_vector<double>();  // under the limit: factor 1
  EXPECT_DOUBLE_EQ(v[0], norm);
  EXPECT_EQ(v[1], 1.0);
  v = optim::clip_grad_norm({a, b}, 0.0).to_vector<double>();  // only measures
  EXPECT_EQ(v[1], 1.0);

  // Gradients that carry a loss scale of 1024, written into a given buffer.
  set_grad(a, {3.0 * 1024});
  set_grad(b, {0.0, 4.0 * 1024});
  Tensor out = full({2}, std::nan(""), DType::f64, device()), found_inf = scalar(-1.0);  // poisoned
  Tensor same = optim::clip_grad_norm({a, b}, 1.0, scalar(1024.0), found_inf, out);
  EXPECT_TRUE(same.same(out));
  v = out.to_vector<double>();
  EXPECT_DOUBLE_EQ(v[0], norm);
  EXPECT_DOUBLE_EQ(v[1], 1.0 / (norm + 1e-6) / 1024);
  EXPECT_EQ(found_inf.item<double>(), 0.0);

  // A non-finite gradient: norm +inf, nothing clipped (factor 1 / scale), the flag raised.
  for (double bad : {std::numeric_limits<double>::infinity(), std::nan("")}) {
    set_grad(b, {bad, 4.0});
    v = optim::clip_grad_norm({a, b}, 1.0, scalar(1024.0), found_inf, out).to_vector<double>();
    EXPECT_TRUE(std::isinf(v[0]) && v[0] > 0);
    EXPECT_EQ(v[1], 1.0 / 1024);
    EXPECT_EQ(found_inf.item<double>(), 1.0);
  }
}

// A 16-bit gradient read with round_scaled_grads_to_f32 (ZeRO-1 reading its bf16/f16 reduce
// staging, distributed/zero.h) steps an f32 or bf16 parameter bit for bit as the f32 gradient
// it widens to does, the gradient factor included; without the option the scaled gradient is
// rounded to its 16-bit dtype, as an in-place scaling of it would store it: another update.
TEST_P(OptimizerOn, A16BitGradientRoundedToF32StepsAsItsF32Widening) {
  struct Case {
    bool sgd;
    DType param, grad;
  };
  for (const Case& c : {Case{false, DType::f32, DType::bf16}, Case{false, DType::bf16, DType::bf16},
                        Case{false, DType::f32, DType::f16}, Case{true, DType::f32, DType::bf16},
                        Case{true, DType::bf16, DType::f16}}) {
    SCOPED_TRACE(std::string(c.sgd ? "SGD, " : "AdamW, ") + dtype_name(c.param) + " params, " + dtype_name(c.grad) +
                 " grads");
    const Tensor start = precis::testing::random_f64({64}, 5).to(c.param).to(device());
    auto run = [&](DType grad_dtype, bool in_f32) {
      Tensor p = start.clone().set_requires_grad();
      std::unique_ptr<optim::Optimizer> opt;
      if (c.sgd)
        opt = std::make_unique<optim::SGD>(std::vector<optim::ParamGroup>{{{p}, 0.1}},
                                           optim::SGDOptions{.lr = 0.1, .momentum = 0.9, .master_weights = true});
      else
        opt = std::make_unique<optim::AdamW>(std::vector<optim::ParamGroup>{{{p}, 0.1}},
                                             optim::AdamWOptions{.lr = 0.01, .master_weights = true});
      for (int step = 0; step < 3; ++step) {
        // 16-bit values, so the widened f32 gradient holds the same numbers.
        p.set_grad(precis::testing::random_f64({64}, 10 + step).to(c.grad).to(grad_dtype).to(device()));
        opt->step({.grad_factor = scalar(0.3 + 0.1 * step), .round_scaled_grads_to_f32 = in_f32});
      }
      // The parameter, then its f32 master copy when it has one (a bf16 parameter may round both updates alike).
      std::vector<double> out = p.to(Device::cpu()).to(DType::f64).to_vector<double>();
      if (opt->master(0).defined())
        for (double v : opt->master(0).to(Device::cpu()).to(DType::f64).to_vector<double>()) out.push_back(v);
      return out;
    };
    const std::vector<double> widened = run(DType::f32, false);
    EXPECT_EQ(run(c.grad, true), widened);
    EXPECT_NE(run(c.grad, false), widened) << "the option must matter for this test to mean anything";
  }
}

// Optimizer::set_compute_copies: after every step, each f32 parameter's copy holds the same bits
// as a cast of the parameter to the copy's dtype (nearest even), and a skipped step leaves both
// as they were. Sizes past one block and one vector access, a copy that starts 2 bytes off its
// vector alignment (the GPU's element-wise path), a channels-last weight, a parameter without a
// copy, and both copy dtypes.
TEST_P(OptimizerOn, ComputeCopiesHoldTheUpdatedWeightsCast) {
  for (const bool sgd : {true, false}) {
    SCOPED_TRACE(sgd ? "SGD" : "AdamW");
    const std::vector<Shape> shapes = {{1}, {7}, {513}, {20000}, {8, 5, 3, 3}, {33}, {6}};
    std::vector<Tensor> params, copies;
    for (size_t i = 0; i < shapes.size(); ++i) {
      Tensor p = shapes[i].size() == 4
                     ? ops::empty_in(shapes[i], ops::MemoryFormat::channels_last, DType::f32, device())
                     : empty(shapes[i], DType::f32, device());
      copy_(p, random_f64(shapes[i], 10 + i));
      params.push_back(p.set_requires_grad());
      const DType copy_dtype = i % 2 == 0 ? DType::bf16 : DType::f16;
      if (i == 5) {  // one element into a larger tensor: misaligned
        copies.push_back(empty({shapes[i][0] + 1}, copy_dtype, device()).narrow(0, 1, shapes[i][0]));
      } else if (i == 6) {
        copies.push_back(Tensor());  // this one has none
      } else {
        copies.push_back(empty_with_layout_of(p, copy_dtype));
      }
    }
    std::unique_ptr<optim::Optimizer> opt;
    if (sgd)
      opt = std::make_unique<optim::SGD>(std::vector<optim::ParamGroup>{{params, 0.01}},
                                         optim::SGDOptions{.lr = 0.1, .momentum = 0.9});
    else
      opt = std::make_unique<optim::AdamW>(std::vector<optim::ParamGroup>{{params, 0.01}},
                                           optim::AdamWOptions{.lr = 0.01});
    opt->set_compute_copies(copies);
    for (int step = 0; step < 4; ++step) {
      SCOPED_TRACE("step " + std::to_string(step));
      const bool skipped = step == 2;
      std::vector<std::vector<float>> before;
      for (const Tensor& c : copies)
        before.push_back(c.defined() ? c.to(DType::f32).to_vector<float>() : std::vector<float>());
      for (size_t i = 0; i < params.size(); ++i) {
        Tensor g = empty_with_layout_of(params[i], DType::f32);
        copy_(g, random_f64(shapes[i], 100 * step + i));
        params[i].set_grad(g);
      }
      opt->step({.skip_if = scalar(skipped ? 1.0 : 0.0)});
      for (size_t i = 0; i < params.size(); ++i) {
        if (!copies[i].defined()) continue;
        const std::vector<float> copy = copies[i].to(DType::f32).to_vector<float>();
        EXPECT_EQ(copy, params[i].to(copies[i].dtype()).to(DType::f32).to_vector<float>()) << "parameter " << i;
        if (skipped) {
          EXPECT_EQ(copy, before[i]) << "parameter " << i << ": a skipped step writes nothing";
        }
      }
    }
  }
}

TEST_P(OptimizerOn, ComputeCopiesMustMatchTheirParameters) {
  Tensor f64_param = param({1.0, 2.0});
  Tensor f32_param = f64_param.detach().to(DType::f32).set_requires_grad();
  optim::SGD f64_sgd({{{f64_param}, 0.0}}, {.lr = 0.1});
  precis::testing::expect_error([&] { f64_sgd.set_compute_copies({empty({2}, DType::bf16, device())}); },
                                "copies are f16 or bf16, of f32 parameters");
  optim::SGD sgd({{{f32_param}, 0.0}}, {.lr = 0.1});
  precis::testing::expect_error([&] { sgd.set_compute_copies({empty({3}, DType::bf16, device())}); },
                                "must have the shape, strides and device of the parameter");
  precis::testing::expect_error([&] { sgd.set_compute_copies({empty({2}, DType::f32, device())}); },
                                "copies are f16 or bf16");
  precis::testing::expect_error([&] { sgd.set_compute_copies({Tensor(), Tensor()}); }, "2 copies for 1 parameters");
}

}  // namespace optimizer_cases
