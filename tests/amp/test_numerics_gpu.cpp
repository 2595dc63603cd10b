// The numerics report's GPU counters (amp/cuda/numerics.cu) against the CPU loop, the
// reference, on the same values: every counter and max_abs must be equal, for each floating
// dtype, at and around the fp16 thresholds, for strided and misaligned views, for tensors
// of millions of elements (many blocks, many atomics), and for updates with lost steps.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "amp/numerics.h"
#include "support/gpu.h"
#include "support/gpu_compare.h"

using namespace precis;
using precis::testing::kCpu;
using precis::testing::kFloating;
using precis::testing::kGpu;

namespace {

const double kInf = std::numeric_limits<double>::infinity();
const double kNaN = std::numeric_limits<double>::quiet_NaN();

void expect_same(const amp::TensorNumerics& gpu, const amp::TensorNumerics& cpu) {
  EXPECT_EQ(gpu.count, cpu.count);
  EXPECT_EQ(gpu.max_abs, cpu.max_abs);
  EXPECT_EQ(gpu.zero, cpu.zero);
  EXPECT_EQ(gpu.fp16_subnormal, cpu.fp16_subnormal);
  EXPECT_EQ(gpu.fp16_underflow, cpu.fp16_underflow);
  EXPECT_EQ(gpu.inf, cpu.inf);
  EXPECT_EQ(gpu.nan, cpu.nan);
  EXPECT_EQ(gpu.lost, cpu.lost);
  EXPECT_EQ(gpu.eligible, cpu.eligible);
}

// add_values on a CPU tensor and on the same values (any view) on the GPU, compared.
amp::TensorNumerics values_on_both(const Tensor& cpu, const Tensor& gpu) {
  amp::TensorNumerics on_cpu, on_gpu;
  on_cpu.add_values(cpu);
  on_gpu.add_values(gpu);
  expect_same(on_gpu, on_cpu);
  return on_cpu;
}

amp::TensorNumerics update_on_both(const Tensor& before, const Tensor& after, const Tensor& grad) {
  amp::TensorNumerics on_cpu, on_gpu;
  on_cpu.add_update(before, after, grad);
  on_gpu.add_update(before.to(kGpu), after.to(kGpu), grad.to(kGpu));
  expect_same(on_gpu, on_cpu);
  return on_cpu;
}

// Each threshold t of the report, its neighbours in formats of 8, 11, 24 and 53 bits (bf16,
// f16, f32, f64: t (1 - 2^-p) and t (1 + 2^(1-p)) for a power of two t, exact where normal;
// the other dtypes round them), halfway points, and both signs.
std::vector<double> around(double t) {
  std::vector<double> magnitudes = {t, t * 0.75, t * 1.5, t / 2};
  for (int p : {8, 11, 24, 53}) {
    magnitudes.push_back(t * (1 - std::ldexp(1.0, -p)));
    magnitudes.push_back(t * (1 + std::ldexp(1.0, 1 - p)));
  }
  std::vector<double> v;
  for (double x : magnitudes)
    for (double sign : {1.0, -1.0}) v.push_back(sign * x);
  return v;
}

// The values at and around the thresholds, in `dtype` (rounded into it on the CPU).
Tensor threshold_values(DType dtype) {
  std::vector<double> v = {0.0,     -0.0,     kInf, -kInf, kNaN,   -kNaN, 65504.0, -65504.0,
                           70000.0, -70000.0, 1.0,  1e-40, -1e-45, 1e-300};  // f32 subnormals, an f64-only tiny value
  for (double t : {std::ldexp(1.0, -14), std::ldexp(1.0, -25), std::ldexp(1.0, -24)})
    for (double x : around(t)) v.push_back(x);
  // fp16 subnormals: k 2^-24, the smallest, one between, the largest.
  for (double k : {1.0, 3.0, 511.0, 1023.0}) v.push_back(k * std::ldexp(1.0, -24));
  return from_vector<double>(v, {static_cast<int64_t>(v.size())}).to(dtype);
}

// n values spread over magnitudes 2^-40 .. 2^20 with both signs, exact zeros, and inf/NaN sprinkled in.
std::vector<double> spread_values(int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> exponent(-40.0, 20.0);
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    double x = std::exp2(exponent(rng)) * (rng() % 2 ? 1.0 : -1.0);
    if (i % 97 == 0) x = 0.0;
    if (i % 1009 == 0) x = kInf;
    if (i % 1013 == 0) x = kNaN;
    v[static_cast<size_t>(i)] = x;
  }
  return v;
}

// An update over `values`: before; after = before + delta with deltas that some dtypes lose
// to rounding, every third left unchanged; grad zero, nonzero, inf or NaN.
struct Update {
  Tensor before, after, grad;
};
Update make_update(int64_t n, DType dtype, DType grad_dtype, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> unit(0.5, 2.0), log_step(-30.0, -2.0);
  std::vector<double> before(static_cast<size_t>(n)), delta(static_cast<size_t>(n)), grad(static_cast<size_t>(n));
  for (size_t i = 0; i < before.size(); ++i) {
    before[i] = unit(rng) * (rng() % 2 ? 1.0 : -1.0);
    delta[i] = i % 3 == 0 ? 0.0 : std::exp2(log_step(rng)) * (rng() % 2 ? 1.0 : -1.0);
    grad[i] = i % 5 == 0 ? 0.0 : i % 7 == 0 ? kInf : i % 11 == 0 ? kNaN : i % 13 == 0 ? -kInf : unit(rng) - 1.25;
  }
  Update u;
  u.before = from_vector<double>(before, {n}).to(dtype);
  std::vector<double> after = u.before.to_vector<double>();
  for (size_t i = 0; i < after.size(); ++i) after[i] += delta[i];
  u.after = from_vector<double>(after, {n}).to(dtype);
  u.grad = from_vector<double>(grad, {n}).to(grad_dtype);
  return u;
}

}  // namespace

TEST(NumericsGpu, ValuesAtAndAroundTheThresholdsMatchTheCpu) {
  PRECIS_SKIP_WITHOUT_GPU();
  for (DType dtype : kFloating) {
    SCOPED_TRACE(dtype_name(dtype));
    const Tensor cpu = threshold_values(dtype);
    const amp::TensorNumerics s = values_on_both(cpu, cpu.to(kGpu));
    // Every category is exercised.
    EXPECT_GT(s.zero, 0);
    EXPECT_GT(s.fp16_subnormal, 0);
    // fp16's own nonzero values all reach 2^-24: none is below 2^-25.
    if (dtype == DType::f16)
      EXPECT_EQ(s.fp16_underflow, 0);
    else
      EXPECT_GT(s.fp16_underflow, 0);
    EXPECT_GT(s.inf, 0);
    EXPECT_GT(s.nan, 0);
  }
}

TEST(NumericsGpu, EachThresholdAloneIsClassifiedAsOnTheCpu) {
  PRECIS_SKIP_WITHOUT_GPU();
  // One value a tensor, so a misclassification names the value.
  for (DType dtype : kFloating) {
    const std::vector<double> values = threshold_values(dtype).to_vector<double>();
    for (double x : values) {
      char value[64];
      std::snprintf(value, sizeof value, " value %.17g", x);
      SCOPED_TRACE(std::string(dtype_name(dtype)) + value);
      const Tensor cpu = from_vector<double>({x}, {1}).to(dtype);
      values_on_both(cpu, cpu.to(kGpu));
    }
  }
}

TEST(NumericsGpu, StridedAndMisalignedViewsMatchTheCpu) {
  PRECIS_SKIP_WITHOUT_GPU();
  for (DType dtype : kFloating) {
    SCOPED_TRACE(dtype_name(dtype));
    const Tensor cpu = from_vector<double>(spread_values(37 * 41, 7), {37, 41}).to(dtype);
    const Tensor gpu = cpu.to(kGpu);
    ASSERT_FALSE(gpu.transpose(0, 1).is_contiguous());
    values_on_both(cpu.transpose(0, 1), gpu.transpose(0, 1));
    values_on_both(cpu.slice(1, 0, 41, 3), gpu.slice(1, 0, 41, 3));
    // One element past a pack boundary, and a length that leaves a tail.
    const Tensor flat = cpu.reshape({37 * 41}), flat_gpu = gpu.reshape({37 * 41});
    values_on_both(flat.slice(0, 1, 37 * 41 - 2), flat_gpu.slice(0, 1, 37 * 41 - 2));
  }
}

TEST(NumericsGpu, MillionsOfValuesMatchTheCpu) {
  PRECIS_SKIP_WITHOUT_GPU();
  const int64_t n = 3'000'017;  // many blocks, each thread many packs, and a tail
  const std::vector<double> values = spread_values(n, 11);
  for (DType dtype : kFloating) {
    SCOPED_TRACE(dtype_name(dtype));
    const Tensor cpu = from_vector<double>(values, {n}).to(dtype);
    const amp::TensorNumerics s = values_on_both(cpu, cpu.to(kGpu));
    EXPECT_GT(s.fp16_subnormal, 0);
    EXPECT_GT(s.nan, 0);
  }
}

TEST(NumericsGpu, CountsAddUpOverCallsAsOnTheCpu) {
  PRECIS_SKIP_WITHOUT_GPU();
  amp::TensorNumerics on_cpu, on_gpu;
  for (DType dtype : kFloating) {
    const Tensor cpu = threshold_values(dtype);
    on_cpu.add_values(cpu);
    on_gpu.add_values(cpu.to(kGpu));
  }
  on_cpu.add_values(empty({0}, DType::f32));
  on_gpu.add_values(empty({0}, DType::f32, kGpu));
  expect_same(on_gpu, on_cpu);
}

TEST(NumericsGpu, UpdatesWithLostStepsMatchTheCpu) {
  PRECIS_SKIP_WITHOUT_GPU();
  for (DType dtype : kFloating) {
    for (int64_t n : {1, 5, 4099, 2'000'003}) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + " n=" + std::to_string(n));
      const Update u = make_update(n, dtype, dtype, static_cast<uint64_t>(n));
      const amp::TensorNumerics s = update_on_both(u.before, u.after, u.grad);
      if (n > 1000) {
        EXPECT_GT(s.lost, 0);
        EXPECT_LT(s.eligible, n);  // zero and non-finite gradients are not eligible
      }
    }
  }
}

TEST(NumericsGpu, UpdatesWithAGradientInAnotherDtypeMatchTheCpu) {
  PRECIS_SKIP_WITHOUT_GPU();
  for (auto [param, grad] : {std::pair{DType::bf16, DType::f32}, std::pair{DType::f32, DType::f16}}) {
    SCOPED_TRACE(std::string(dtype_name(param)) + " with " + dtype_name(grad) + " gradients");
    const Update u = make_update(10'007, param, grad, 3);
    update_on_both(u.before, u.after, u.grad);
  }
}

TEST(NumericsGpu, StridedAndMisalignedUpdatesMatchTheCpu) {
  PRECIS_SKIP_WITHOUT_GPU();
  for (DType dtype : kFloating) {
    SCOPED_TRACE(dtype_name(dtype));
    const int64_t rows = 29, cols = 43, n = rows * cols;
    const Update u = make_update(n, dtype, dtype, 5);
    const Tensor bg = u.before.to(kGpu), ag = u.after.to(kGpu), gg = u.grad.to(kGpu);
    amp::TensorNumerics on_cpu, on_gpu;
    // before and grad through view_bg, after through view_a, on both devices.
    auto add_both = [&](auto view_bg, auto view_a) {
      on_cpu.add_update(view_bg(u.before), view_a(u.after), view_bg(u.grad));
      on_gpu.add_update(view_bg(bg), view_a(ag), view_bg(gg));
    };
    auto transposed = [&](const Tensor& t) { return t.reshape({rows, cols}).transpose(0, 1); };
    ASSERT_FALSE(transposed(ag).is_contiguous());
    add_both(transposed, transposed);
    // All three one element past a pack boundary (the packed kernel, with a head), then
    // before and grad out of after's phase (the unpacked kernel).
    auto from_1 = [&](const Tensor& t) { return t.slice(0, 1, n); };
    auto to_last = [&](const Tensor& t) { return t.slice(0, 0, n - 1); };
    add_both(from_1, from_1);
    add_both(to_last, from_1);
    expect_same(on_gpu, on_cpu);
    EXPECT_EQ(on_cpu.count, 3 * n - 2);
  }
}

TEST(NumericsGpu, NonFiniteUpdatesKeepTheCpuMax) {
  PRECIS_SKIP_WITHOUT_GPU();
  for (DType dtype : kFloating) {
    SCOPED_TRACE(dtype_name(dtype));
    // inf - inf is NaN: left out of the max; 1 -> 2 gives the finite max.
    const amp::TensorNumerics finite = update_on_both(tensor({kInf, 1.0, 0.5}, dtype), tensor({kInf, 2.0, 0.5}, dtype),
                                                      tensor({1.0, 1.0, 1.0}, dtype));
    EXPECT_EQ(finite.max_abs, 1.0);
    EXPECT_EQ(finite.lost, 1);
    // A parameter that became inf: an infinite max.
    const amp::TensorNumerics infinite =
        update_on_both(tensor({1.0, 1.0}, dtype), tensor({kInf, 1.0}, dtype), tensor({kNaN, 0.0}, dtype));
    EXPECT_EQ(infinite.max_abs, kInf);
    EXPECT_EQ(infinite.eligible, 0);
  }
}

TEST(NumericsGpu, TheReportOfGpuTensorsEqualsTheCpuReport) {
  PRECIS_SKIP_WITHOUT_GPU();
  amp::NumericsReport on_cpu, on_gpu;
  const Tensor act = from_vector<double>(spread_values(5000, 1), {50, 100}).to(DType::bf16);
  const Tensor grad = from_vector<double>(spread_values(3000, 2), {3000}).to(DType::f16);
  const Update u = make_update(6000, DType::f32, DType::f32, 9);
  on_cpu.record(amp::NumericsKind::activation, "transformer.h.0", act);
  on_gpu.record(amp::NumericsKind::activation, "transformer.h.0", act.to(kGpu));
  on_cpu.record(amp::NumericsKind::gradient, "transformer.h.0", grad);
  on_gpu.record(amp::NumericsKind::gradient, "transformer.h.0", grad.to(kGpu));
  on_cpu.record_update("transformer.h.0", u.before, u.after, u.grad);
  on_gpu.record_update("transformer.h.0", u.before.to(kGpu), u.after.to(kGpu), u.grad.to(kGpu));
  EXPECT_EQ(on_gpu.table(3, 1024), on_cpu.table(3, 1024));
  const auto rows_cpu = on_cpu.json(3, 1024), rows_gpu = on_gpu.json(3, 1024);
  ASSERT_EQ(rows_gpu.size(), rows_cpu.size());
  for (size_t i = 0; i < rows_cpu.size(); ++i) EXPECT_EQ(rows_gpu[i].dump(), rows_cpu[i].dump());
}
