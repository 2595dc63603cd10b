// The optimizers on the GPU: the device-parameterised cases (optim/optimizer_cases.h,
// the same assertions as on the CPU), and the fused GPU AdamW, the GPU SGD and the GPU
// global grad norm against the CPU: several steps over many parameters (more than one
// launch's batch) of odd sizes, misaligned ones among them, two weight-decay groups,
// f32 and f64, f16/bf16 parameters with f32 master weights (nearest and stochastic
// rounding), and f32 parameters with 16-bit gradients (ZeRO-1's staged shards).
// Tolerances: f32 1e-5 relative, f16/bf16 1e-2, f64 1e-12. Skipped, with the reason,
// where no GPU is usable.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "ops/elementwise.h"
#include "optim/optimizer_cases.h"
#include "support/gpu.h"

using namespace precis;
using precis::testing::expect_close;
using precis::testing::random_f64;

namespace optimizer_cases {
INSTANTIATE_TEST_SUITE_P(Cuda, OptimizerOn, ::testing::Values(Device::cuda(0)), precis::testing::device_name);
}  // namespace optimizer_cases

namespace {

const Device kGpu = Device::cuda(0);

Tensor values(const Shape& shape, uint64_t seed, DType dtype, double low = -1.0, double high = 1.0) {
  return random_f64(shape, seed, low, high).to(dtype);
}

double rtol_of(DType dtype) {
  switch (dtype) {
    case DType::f64:
      return 1e-12;
    case DType::f32:
      return 1e-5;
    default:
      return 1e-2;
  }
}

// |gpu - cpu| <= rtol (|cpu| + max|cpu| / 10), rtol by the dtype.
void expect_near(const Tensor& gpu, const Tensor& cpu) {
  ASSERT_TRUE(gpu.is_cuda());
  ASSERT_EQ(gpu.dtype(), cpu.dtype());
  double largest = 0;
  for (double v : cpu.to_vector<double>()) largest = std::max(largest, std::abs(v));
  expect_close(gpu, cpu, rtol_of(cpu.dtype()) * largest / 10, rtol_of(cpu.dtype()));
}

// The same parameters on the CPU and on the GPU: sizes 1 .. 20000 (more than one block),
// more than one launch's batch of them, and one that starts 4 bytes past an aligned address.
struct Twins {
  std::vector<Tensor> cpu, gpu;
};
Twins make_params(DType dtype, uint64_t seed) {
  std::vector<int64_t> sizes = {1, 7, 513, 65 * 33, 20000};
  for (int i = 0; i < 260; ++i) sizes.push_back(i % 5 + 1 + 16 * (i % 3));  // past one launch's 256
  Twins t;
  for (int64_t n : sizes) {
    Tensor host = values({n}, ++seed, dtype);
    t.cpu.push_back(host.detach().set_requires_grad());
    t.gpu.push_back(host.to(kGpu).set_requires_grad());
  }
  // Misaligned: a view one element into a larger buffer (a leaf: the buffer needs no grad).
  Tensor host = values({101}, ++seed, dtype);
  t.cpu.push_back(host.narrow(0, 1, 100).set_requires_grad());
  t.gpu.push_back(host.to(kGpu).narrow(0, 1, 100).set_requires_grad());
  return t;
}

// The same random gradients (of `dtype`) on both twins; the GPU ones, for the last parameter, misaligned too.
void set_grads(Twins& t, DType dtype, uint64_t seed) {
  for (size_t i = 0; i < t.cpu.size(); ++i) {
    const int64_t n = t.cpu[i].numel();
    Tensor g = values({n + 1}, seed * 1000 + i, dtype);
    t.cpu[i].set_grad(g.narrow(0, 1, n).contiguous());
    t.gpu[i].set_grad(i + 1 == t.cpu.size() ? g.to(kGpu).narrow(0, 1, n) : g.narrow(0, 1, n).to(kGpu));
  }
}

// Two groups: weight decay on the even parameters only.
std::vector<optim::ParamGroup> groups_of(const std::vector<Tensor>& params) {
  optim::ParamGroup decay{{}, 0.1}, no_decay{{}, 0.0};
  for (size_t i = 0; i < params.size(); ++i) (i % 2 == 0 ? decay : no_decay).params.push_back(params[i]);
  return {decay, no_decay};
}

// Parameter i of groups_of(params) has optimizer index index_in_groups(i, n).
size_t index_in_groups(size_t i, size_t n) { return i % 2 == 0 ? i / 2 : (n + 1) / 2 + i / 2; }

// Four steps of both optimizers on the same random gradients (of `grad`), then the GPU
// parameters, master copies (when `master`) and step count against the CPU's.
void step_both_and_compare(optim::Optimizer& cpu, optim::Optimizer& gpu, Twins& t, DType grad, bool master) {
  for (int step = 1; step <= 4; ++step) {
    set_grads(t, grad, step);
    cpu.step();
    gpu.step();
  }
  EXPECT_EQ(gpu.step_count(), 4);
  for (size_t i = 0; i < t.cpu.size(); ++i) {
    SCOPED_TRACE("parameter " + std::to_string(i));
    expect_near(t.gpu[i], t.cpu[i]);
    const size_t index = index_in_groups(i, t.cpu.size());
    ASSERT_EQ(gpu.master(index).defined(), master);
    if (master) expect_near(gpu.master(index), cpu.master(index));
  }
}

}  // namespace

TEST(AdamWGpu, MatchesTheCpuOverSeveralSteps) {
  PRECIS_SKIP_WITHOUT_GPU();
  for (DType dtype : {DType::f32, DType::f64}) {
    SCOPED_TRACE(dtype_name(dtype));
    Twins t = make_params(dtype, 10);
    const optim::AdamWOptions options{.lr = 0.01, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8};
    optim::AdamW cpu(groups_of(t.cpu), options), gpu(groups_of(t.gpu), options);
    for (int step = 1; step <= 5; ++step) {
      set_grads(t, dtype, step);
      cpu.step();
      gpu.step();
    }
    const auto cpu_state = cpu.state_dict(), gpu_state = gpu.state_dict();
    for (size_t i = 0; i < t.cpu.size(); ++i) {
      SCOPED_TRACE("parameter " + std::to_string(i));
      expect_near(t.gpu[i], t.cpu[i]);
      const std::string key = "state." + std::to_string(index_in_groups(i, t.cpu.size()));
      expect_near(gpu_state.at(key + ".exp_avg"), cpu_state.at(key + ".exp_avg"));
      expect_near(gpu_state.at(key + ".exp_avg_sq"), cpu_state.at(key + ".exp_avg_sq"));
    }
  }
}

TEST(AdamWGpu, LowPrecisionParametersMatchTheCpu) {
  PRECIS_SKIP_WITHOUT_GPU();
  struct Case {
    DType param, grad;
    bool master, stochastic;
  };
  const Case cases[] = {{DType::bf16, DType::f32, true, false},   {DType::bf16, DType::f32, true, true},
                        {DType::bf16, DType::bf16, false, false}, {DType::bf16, DType::f32, false, true},
                        {DType::f16, DType::f32, true, false},    {DType::f16, DType::f16, false, false},
                        {DType::f32, DType::bf16, false, false},  {DType::bf16, DType::f16, true, false}};
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(dtype_name(c.param)) + " params, " + dtype_name(c.grad) + " grads" +
                 (c.master ? ", master weights" : "") + (c.stochastic ? ", stochastic rounding" : ""));
    Twins t = make_params(c.param, 20);
    optim::AdamWOptions options{.lr = 0.01, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8};
    options.master_weights = c.master;
    options.stochastic_rounding = c.stochastic;
    options.seed = 1234;
    optim::AdamW cpu(groups_of(t.cpu), options), gpu(groups_of(t.gpu), options);
    step_both_and_compare(cpu, gpu, t, c.grad, c.master);
  }
}

TEST(SGDGpu, MatchesTheCpuOverSeveralSteps) {
  PRECIS_SKIP_WITHOUT_GPU();
  struct Case {
    DType param, grad;
    bool master, stochastic;
    double momentum;
    bool nesterov;
  };
  const Case cases[] = {
      {DType::f32, DType::f32, false, false, 0.9, false},  {DType::f64, DType::f64, false, false, 0.9, true},
      {DType::f32, DType::f32, false, false, 0.0, false},  {DType::bf16, DType::f32, true, false, 0.9, false},
      {DType::bf16, DType::f32, true, true, 0.9, true},    {DType::bf16, DType::bf16, false, false, 0.0, false},
      {DType::f16, DType::f32, true, false, 0.5, false},   {DType::f16, DType::f16, false, false, 0.9, false},
      {DType::f32, DType::bf16, false, false, 0.9, false}, {DType::f32, DType::f16, false, false, 0.9, true}};
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(dtype_name(c.param)) + " params, " + dtype_name(c.grad) + " grads" +
                 (c.master ? ", master weights" : "") + (c.stochastic ? ", stochastic rounding" : "") + ", momentum " +
                 std::to_string(c.momentum) + (c.nesterov ? " nesterov" : ""));
    Twins t = make_params(c.param, 25);
    optim::SGDOptions options{.lr = 0.05, .momentum = c.momentum, .nesterov = c.nesterov};
    options.master_weights = c.master;
    options.stochastic_rounding = c.stochastic;
    options.seed = 77;
    optim::SGD cpu(groups_of(t.cpu), options), gpu(groups_of(t.gpu), options);
    step_both_and_compare(cpu, gpu, t, c.grad, c.master);
    const auto cpu_state = cpu.state_dict(), gpu_state = gpu.state_dict();
    for (size_t i = 0; i < t.cpu.size(); ++i) {
      SCOPED_TRACE("parameter " + std::to_string(i));
      const size_t index = index_in_groups(i, t.cpu.size());
      const std::string key = "state." + std::to_string(index) + ".momentum_buffer";
      ASSERT_EQ(gpu_state.count(key), cpu_state.count(key));
      if (cpu_state.count(key)) expect_near(gpu_state.at(key), cpu_state.at(key));
    }
  }
}

TEST(ClipGradNormGpu, MatchesTheCpu) {
  PRECIS_SKIP_WITHOUT_GPU();
  // f32 parameters and a few bf16 ones, more than one launch's batch, one of 100000 values (several blocks).
  Twins t = make_params(DType::f32, 30);
  for (int i = 0; i < 3; ++i) {
    Tensor host = values({100000 / (i + 1)}, 40 + i, DType::bf16);
    t.cpu.push_back(host.detach().set_requires_grad());
    t.gpu.push_back(host.to(kGpu).set_requires_grad());
  }
  for (size_t i = 0; i < t.cpu.size(); ++i) {
    Tensor g = values(t.cpu[i].shape(), 50 + i, t.cpu[i].dtype());
    t.cpu[i].set_grad(g);
    t.gpu[i].set_grad(g.to(kGpu));
  }
  // Under the limit: the norm, factor 1, and no change.
  const std::vector<double> cpu_under = optim::clip_grad_norm(t.cpu, 1e9).to_vector<double>();
  const Tensor gpu_under = optim::clip_grad_norm(t.gpu, 1e9);
  ASSERT_TRUE(gpu_under.is_cuda());
  const double norm_cpu = cpu_under[0], norm_gpu = gpu_under.to_vector<double>()[0];
  EXPECT_NEAR(norm_gpu, norm_cpu, 1e-12 * norm_cpu);
  EXPECT_EQ(gpu_under.to_vector<double>()[1], 1.0);
  EXPECT_EQ(optim::clip_grad_norm(t.gpu, 0.0).to_vector<double>()[0], norm_gpu);  // the same bits on every run
  // Over the limit: the factor that takes the norm to max_norm; the gradients are left as they are.
  const std::vector<double> over = optim::clip_grad_norm(t.gpu, 1.0).to_vector<double>();
  EXPECT_NEAR(over[0], norm_cpu, 1e-12 * norm_cpu);
  EXPECT_NEAR(over[1], 1.0 / (norm_cpu + 1e-6), 1e-12 / norm_cpu);
  EXPECT_NEAR(over[1], optim::clip_grad_norm(t.cpu, 1.0).to_vector<double>()[1], 1e-12 / norm_cpu);
  for (size_t i = 0; i < t.cpu.size(); ++i) expect_close(t.gpu[i].grad(), t.cpu[i].grad(), 0, 0);
}

TEST(ClipGradNormGpu, NonFiniteNormsClipNothing) {
  PRECIS_SKIP_WITHOUT_GPU();
  Tensor p = values({1000}, 60, DType::f32).to(kGpu).set_requires_grad();
  Tensor g = values({1000}, 61, DType::f32);
  std::vector<float> v = g.to_vector<float>();
  v[517] = std::numeric_limits<float>::infinity();
  p.set_grad(from_vector(v, {1000}).to(kGpu));
  const std::vector<double> r = optim::clip_grad_norm({p}, 1.0).to_vector<double>();
  EXPECT_TRUE(std::isinf(r[0]));
  EXPECT_EQ(r[1], 1.0);
  expect_close(p.grad(), from_vector(v, {1000}), 0, 0);
}

// The step as the trainer ends it, on the GPU against the CPU: a new learning rate every
// step, clipping on every step, and a skipped step that must change nothing, count included.
// The GPU gradients carry a loss scale of 1024 that clip_grad_norm takes out (the norm, and
// the factor the optimizer applies), and an inf in one of them is what skips the step; the
// CPU twins have unscaled gradients and no skip.
TEST(OptimizersGpu, LossScaledClippedStepWithASkipMatchesTheCpu) {
  PRECIS_SKIP_WITHOUT_GPU();
  struct Case {
    bool sgd;
    DType param, grad;
    bool stochastic;
  };
  for (const Case& c : {Case{false, DType::f32, DType::f32, false}, Case{false, DType::bf16, DType::f32, true},
                        Case{true, DType::f32, DType::f32, false}, Case{true, DType::bf16, DType::f32, true}}) {
    SCOPED_TRACE(std::string(c.sgd ? "SGD " : "AdamW ") + dtype_name(c.param) +
                 (c.stochastic ? ", stochastic rounding" : ""));
    Twins t = make_params(c.param, 70);
    std::unique_ptr<optim::Optimizer> cpu, gpu;
    if (c.sgd) {
      optim::SGDOptions options{.lr = 0.01, .momentum = 0.9};
      options.stochastic_rounding = c.stochastic;
      options.seed = 99;
      cpu = std::make_unique<optim::SGD>(groups_of(t.cpu), options);
      gpu = std::make_unique<optim::SGD>(groups_of(t.gpu), options);
    } else {
      optim::AdamWOptions options{.lr = 0.01, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8};
      options.stochastic_rounding = c.stochastic;
      options.seed = 99;
      cpu = std::make_unique<optim::AdamW>(groups_of(t.cpu), options);
      gpu = std::make_unique<optim::AdamW>(groups_of(t.gpu), options);
    }
    const double loss_scale = 1024;
    Tensor clip = empty({2}, DType::f64, kGpu), skip = full({}, -1.0, DType::f64, kGpu);
    const Tensor scale = full({}, loss_scale, DType::f64, kGpu);
    const double max_norm = 0.5;  // the random gradients' norm is ~90: clipped every step
    for (int step = 1; step <= 6; ++step) {
      SCOPED_TRACE("step " + std::to_string(step));
      const bool skipped = step == 3;
      const double lr = 0.002 * step;
      set_grads(t, c.grad, step);
      for (const Tensor& p : t.gpu) copy_(p.grad(), ops::mul(p.grad(), loss_scale));  // exact: a power of two
      if (skipped) fill_(t.gpu[2].grad().slice(0, 100, 101), INFINITY);
      std::vector<Tensor> before;
      for (const Tensor& p : t.gpu) before.push_back(p.detach().clone());
      gpu->set_lr(lr);
      optim::clip_grad_norm(t.gpu, max_norm, scale, skip, clip);
      gpu->step({.grad_factor = clip.select(0, 1), .skip_if = skip});
      const std::vector<double> norm_and_factor = clip.to_vector<double>();
      EXPECT_EQ(skip.item<double>(), skipped ? 1.0 : 0.0) << "the inf/NaN flag is written every step";
      if (skipped) {
        EXPECT_TRUE(std::isinf(norm_and_factor[0]));
        EXPECT_EQ(norm_and_factor[1], 1.0 / loss_scale);
        for (size_t i = 0; i < t.gpu.size(); ++i) expect_close(t.gpu[i], before[i], 0, 0);
        continue;
      }
      const Tensor cpu_clip = optim::clip_grad_norm(t.cpu, max_norm);
      const double norm = cpu_clip.to_vector<double>()[0];
      EXPECT_NEAR(norm_and_factor[0], norm, 1e-12 * norm);
      EXPECT_NEAR(norm_and_factor[1], max_norm / (norm + 1e-6) / loss_scale, 1e-12 / loss_scale);
      cpu->set_lr(lr);
      cpu->step({.grad_factor = cpu_clip.select(0, 1)});
    }
    EXPECT_EQ(gpu->step_count(), 5) << "the skipped step does not count";
    EXPECT_EQ(gpu->state_dict().at("step").item<int64_t>(), 5);
    for (size_t i = 0; i < t.cpu.size(); ++i) {
      SCOPED_TRACE("parameter " + std::to_string(i));
      expect_near(t.gpu[i], t.cpu[i]);
    }
  }
}

// The learning rate and step count live on the parameters' GPU from construction; set_lr
// reaches the step, and loading a state dict sets the step count there.
TEST(AdamWGpu, LearningRateAndStepCountLiveOnTheGpu) {
  PRECIS_SKIP_WITHOUT_GPU();
  Twins t = make_params(DType::f32, 80);
  const optim::AdamWOptions options{.lr = 0.01, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8};
  optim::AdamW cpu(groups_of(t.cpu), options), gpu(groups_of(t.gpu), options);
  EXPECT_EQ(gpu.device(), kGpu);
  for (int step = 1; step <= 3; ++step) {
    set_grads(t, DType::f32, step);
    cpu.set_lr(0.01 / step);
    gpu.set_lr(0.01 / step);
    cpu.step();
    gpu.step();
  }
  EXPECT_EQ(gpu.step_count(), 3);
  for (size_t i = 0; i < t.cpu.size(); ++i) expect_near(t.gpu[i], t.cpu[i]);
  optim::AdamW loaded(groups_of(t.gpu), options);
  loaded.load_state_dict(cpu.state_dict());
  EXPECT_EQ(loaded.step_count(), 3);
}
