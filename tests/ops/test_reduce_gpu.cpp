// GPU reductions against the CPU: sum and mean over any dims (keepdim, negative dims,
// several dims, full reductions, 1M elements; the row, column and permuted-copy
// layouts; transposed and sliced inputs), sum_to_shape, max(dim) with indices, max(x),
// amax (ties), var, and every backward, in f32, f64, f16 and bf16 (and i32/i64 where
// the op takes them). The CPU reference runs on the very values the GPU gets. Freed
// device blocks of each output's size are filled with NaN (or 0xAB bytes) first, so an
// output that reuses one and leaves an element unwritten fails. Skipped, with the
// reason, where no GPU is usable.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "core/copy.h"
#include "core/random.h"
#include "ops/ops.h"
#include "support/gpu.h"
#include "support/gpu_compare.h"
#include "support/gradcheck.h"

using namespace precis;
using precis::testing::expect_matches;
using precis::testing::kCpu;
using precis::testing::kFloating;
using precis::testing::kGpu;
using precis::testing::kNaN;
using precis::testing::poison;
using precis::testing::random_f64;
using precis::testing::tolerance_for;

namespace {

void expect_identical(const Tensor& gpu, const Tensor& cpu) {
  ASSERT_TRUE(gpu.is_cuda());
  ASSERT_EQ(gpu.dtype(), cpu.dtype());
  ASSERT_EQ(gpu.shape(), cpu.shape());
  std::vector<double> g = gpu.to(kCpu).to_vector<double>(), c = cpu.to_vector<double>();
  for (size_t i = 0; i < c.size(); ++i) {
    if (std::isnan(c[i])) {
      ASSERT_TRUE(std::isnan(g[i])) << "element " << i << ": got " << g[i] << ", expected NaN";
    } else {
      ASSERT_EQ(g[i], c[i]) << "element " << i;
    }
  }
}

struct Input {
  Tensor cpu, gpu;
};

enum class Layout { dense, transposed, sliced };
const char* layout_name(Layout layout) {
  switch (layout) {
    case Layout::dense:
      return "dense";
    case Layout::transposed:
      return "transposed";
    case Layout::sliced:
      return "sliced";
  }
  return "?";
}

// `values` (a CPU tensor of `shape`) rounded to `dtype` and laid out as asked on both devices:
// a transpose of a tensor with the last two dims swapped, or every other element of a wider
// last dim. The views hold the same values in the same logical order as `values`.
Input lay_out(const Tensor& values, DType dtype, Layout layout) {
  Tensor v = values.to(dtype);
  auto both = [](const Tensor& base, const std::function<Tensor(const Tensor&)>& view) {
    return Input{view(base), view(base.to(kGpu))};
  };
  const int64_t nd = v.dim();
  switch (layout) {
    case Layout::dense:
      return both(v.contiguous(), [](const Tensor& t) { return t; });
    case Layout::transposed:
      return both(v.transpose(nd - 1, nd - 2).contiguous(),
                  [nd](const Tensor& t) { return t.transpose(nd - 1, nd - 2); });
    case Layout::sliced: {
      // The even elements of a last dim twice as long; the odd ones hold -77, which shows if read.
      const int64_t n = v.shape().back();
      Shape wide = v.shape();
      wide.back() = 2 * n;
      Tensor base = full(wide, -77.0, dtype);
      copy_(base.slice(nd - 1, 0, 2 * n, 2), v);
      return both(base, [nd, n](const Tensor& t) { return t.slice(nd - 1, 0, 2 * n, 2); });
    }
  }
  return {};
}

Input make_input(const Shape& shape, DType dtype, Layout layout, uint64_t seed, double low, double high) {
  if (dtype == DType::i32 || dtype == DType::i64) {
    Generator gen(seed);
    return lay_out(randint(-100, 100, shape, DType::i64, &gen), dtype, layout);
  }
  return lay_out(random_f64(shape, seed, low, high), dtype, layout);
}

// Small integers as floats: many ties for max.
Input tied_input(const Shape& shape, DType dtype, Layout layout, uint64_t seed) {
  Generator gen(seed);
  return lay_out(randint(0, 6, shape, DType::i64, &gen).to(DType::f64), dtype, layout);
}

struct Reduction {
  Shape shape;
  std::vector<int64_t> dims;
};

// Every layout the CUDA sum picks: rows (innermost dims), columns (leading dims, with and
// without pieces), a middle block, a permuted copy, size-1 and empty dims, full reductions.
const std::vector<Reduction>& reductions() {
  static const std::vector<Reduction> list = {
      {{3, 5, 7}, {0}},    {{3, 5, 7}, {1}},
      {{3, 5, 7}, {2}},    {{3, 5, 7}, {-1}},
      {{3, 5, 7}, {0, 2}}, {{3, 5, 7}, {1, 2}},
      {{3, 5, 7}, {0, 1}}, {{3, 5, 7}, {-3, -1}},
      {{3, 5, 7}, {}},     {{4099, 33}, {0}},
      {{4099, 33}, {1}},   {{33, 4099}, {1}},
      {{33, 4099}, {0}},   {{3, 1000, 64}, {1}},
      {{8192, 48}, {0}},   {{1000, 3}, {0}},
      {{2, 300001}, {1}},  {{1}, {}},
      {{7}, {0}},          {{}, {}},
      {{5, 1, 7}, {1}},    {{2, 3, 1, 9}, {0, 3}},
      {{6, 0}, {1}},       {{0, 6}, {1}},
      {{1023}, {}},        {{4099}, {-1}},
  };
  return list;
}

std::string describe_reduction(const Reduction& r) {
  std::string s = "shape " + ::testing::PrintToString(r.shape) + " dims [";
  for (size_t i = 0; i < r.dims.size(); ++i) s += (i ? ", " : "") + std::to_string(r.dims[i]);
  return s + "]";
}

Shape result_shape(const Shape& shape, const std::vector<int64_t>& dims, bool keepdim) {
  std::vector<bool> reduced(shape.size(), dims.empty());
  for (int64_t d : dims)
    if (!shape.empty()) reduced[d < 0 ? d + static_cast<int64_t>(shape.size()) : d] = true;
  Shape out;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (!reduced[d])
      out.push_back(shape[d]);
    else if (keepdim)
      out.push_back(1);
  }
  return out;
}

std::vector<Layout> layouts_for(const Shape& shape) {
  std::vector<Layout> layouts{Layout::dense};
  if (shape.size() >= 2 && shape_numel(shape) > 0 && shape_numel(shape) < 200000) {
    layouts.push_back(Layout::transposed);
    layouts.push_back(Layout::sliced);
  }
  return layouts;
}

}  // namespace

// ---------------------------------------------------------------- sum, mean, sum_to_shape

TEST(SumGpu, MatchesTheCpuOverEveryLayoutAndDtype) {
  PRECIS_SKIP_WITHOUT_GPU();
  uint64_t seed = 100;
  for (DType dtype : {DType::f32, DType::f64, DType::f16, DType::bf16, DType::i32, DType::i64}) {
    for (const Reduction& r : reductions()) {
      for (Layout layout : layouts_for(r.shape)) {
        for (bool keepdim : {false, true}) {
          SCOPED_TRACE(::testing::Message() << "sum " << dtype << " " << describe_reduction(r) << " "
                                            << layout_name(layout) << (keepdim ? " keepdim" : ""));
          // Positive values: the sum's relative error is what the accumulation controls.
          Input x = make_input(r.shape, dtype, layout, ++seed, 0.5, 1.5);
          Tensor cpu = ops::sum(x.cpu, r.dims, keepdim);
          poison(cpu.shape(), cpu.dtype());
          expect_matches(ops::sum(x.gpu, r.dims, keepdim), cpu);
          if (!is_floating(dtype)) continue;
          if (shape_numel(r.shape) == 0 && cpu.numel() > 0) continue;  // mean over nothing is an error
          Tensor cpu_mean = ops::mean(x.cpu, r.dims, keepdim);
          poison(cpu_mean.shape(), dtype);
          expect_matches(ops::mean(x.gpu, r.dims, keepdim), cpu_mean);
        }
      }
    }
  }
}

TEST(SumGpu, SignedValuesAndAMillionElements) {
  PRECIS_SKIP_WITHOUT_GPU();
  for (DType dtype : kFloating) {
    SCOPED_TRACE(::testing::Message() << dtype);
    const int64_t n = int64_t{1} << 20;
    Input positive = make_input({n}, dtype, Layout::dense, 1, 0.0, 1.0);
    poison({}, dtype);
    expect_matches(ops::sum(positive.gpu), ops::sum(positive.cpu));
    expect_matches(ops::mean(positive.gpu), ops::mean(positive.cpu));
    expect_matches(ops::sum(positive.gpu.view({1024, 1024}), {0}), ops::sum(positive.cpu.view({1024, 1024}), {0}));
    expect_matches(ops::sum(positive.gpu.view({1024, 1024}), {1}), ops::sum(positive.cpu.view({1024, 1024}), {1}));
    // Both signs: the rounding error of the f32 (f64) accumulation is relative to the sum of
    // the magnitudes (about n / 2), not to the sum itself (about sqrt(n)).
    Input signed_values = make_input({n + 1}, dtype, Layout::dense, 2, -1.0, 1.0);
    const double unit_roundoff = dtype == DType::f64 ? 1.1e-16 : 6e-8;
    expect_matches(ops::sum(signed_values.gpu), ops::sum(signed_values.cpu),
                   {8 * unit_roundoff * (n / 2.0), tolerance_for(dtype).rtol});
  }
}

TEST(SumGpu, SumToShapeUndoesBroadcasting) {
  PRECIS_SKIP_WITHOUT_GPU();
  for (DType dtype : kFloating) {
    Input x = make_input({4, 3, 5}, dtype, Layout::dense, 3, 0.5, 1.5);
    for (const Shape& shape : std::vector<Shape>{{3, 1}, {5}, {1, 1, 1}, {4, 3, 5}, {1}, {}, {4, 1, 5}, {3, 5}}) {
      SCOPED_TRACE(::testing::Message() << dtype << " to " << shape);
      Tensor cpu = ops::sum_to_shape(x.cpu, shape);
      poison(shape, dtype);
      expect_matches(ops::sum_to_shape(x.gpu, shape), cpu);
    }
  }
}

TEST(SumGpu, BackwardMatchesTheCpu) {
  PRECIS_SKIP_WITHOUT_GPU();
  uint64_t seed = 200;
  for (DType dtype : kFloating) {
    for (const Reduction& r : reductions()) {
      if (shape_numel(r.shape) == 0) continue;
      for (bool keepdim : {false, true}) {
        for (bool mean : {false, true}) {
          SCOPED_TRACE(::testing::Message() << (mean ? "mean " : "sum ") << dtype << " " << describe_reduction(r)
                                            << (keepdim ? " keepdim" : ""));
          Input x = make_input(r.shape, dtype, Layout::dense, ++seed, -1.0, 1.0);
          Input g = make_input(result_shape(r.shape, r.dims, keepdim), dtype, Layout::dense, ++seed, -1.0, 1.0);
          Tensor xc = x.cpu.detach().set_requires_grad(), xg = x.gpu.detach().set_requires_grad();
          (mean ? ops::mean(xc, r.dims, keepdim) : ops::sum(xc, r.dims, keepdim)).backward(g.cpu);
          poison(r.shape, dtype);
          (mean ? ops::mean(xg, r.dims, keepdim) : ops::sum(xg, r.dims, keepdim)).backward(g.gpu);
          expect_matches(xg.grad(), xc.grad());
        }
      }
    }
  }
}

// ---------------------------------------------------------------- max, amax

TEST(MaxGpu, ValuesAndFirstIndicesEqualTheCpu) {
  PRECIS_SKIP_WITHOUT_GPU();
  const std::vector<std::pair<Shape, int64_t>> cases = {
      {{3, 5, 7}, 0},  {{3, 5, 7}, 1},  {{3, 5, 7}, 2},   {{3, 5, 7}, -1},  {{3, 5, 7}, -3},
      {{4099, 33}, 0}, {{33, 4099}, 1}, {{2, 300001}, 1}, {{300001, 2}, 0}, {{1}, 0},
      {{7}, 0},        {{}, 0},         {{1023}, -1},     {{5, 1, 7}, 1}};
  uint64_t seed = 300;
  for (DType dtype : {DType::f32, DType::f64, DType::f16, DType::bf16, DType::i32, DType::i64}) {
    for (const auto& [shape, dim] : cases) {
      for (Layout layout : layouts_for(shape)) {
        for (bool keepdim : {false, true}) {
          SCOPED_TRACE(::testing::Message() << dtype << " shape " << shape << " dim " << dim << " "
                                            << layout_name(layout) << (keepdim ? " keepdim" : ""));
          Input x = tied_input(shape, dtype, layout, ++seed);
          auto [values, indices] = ops::max(x.cpu, dim, keepdim);
          poison(values.shape(), dtype);
          poison(values.shape(), DType::i64);
          auto [gpu_values, gpu_indices] = ops::max(x.gpu, dim, keepdim);
          expect_identical(gpu_values, values);
          expect_identical(gpu_indices, indices);
        }
      }
    }
  }
}

TEST(MaxGpu, FirstMaximumOfALongRowAndNan) {
  PRECIS_SKIP_WITHOUT_GPU();
  const int64_t n = 1 << 20;
  for (DType dtype : kFloating) {
    SCOPED_TRACE(::testing::Message() << dtype);
    std::vector<double> v = random_f64({2, n}, 4, -1.0, 1.0).to_vector<double>();
    v[123457] = v[n - 5] = 3.0;  // row 0: two maxima, the first wins
    v[n + 999999] = kNaN;        // row 1: NaN beats everything
    v[n + 1000000] = kNaN;
    Tensor x = from_vector(v, {2, n}).to(dtype);
    auto [values, indices] = ops::max(x, 1);
    auto [gpu_values, gpu_indices] = ops::max(x.to(kGpu), 1);
    expect_identical(gpu_values, values);
    expect_identical(gpu_indices, indices);
    EXPECT_EQ(gpu_indices.to(kCpu).to_vector<int64_t>(), (std::vector<int64_t>{123457, 999999}));
    expect_identical(ops::max(x.to(kGpu)), ops::max(x));
    expect_identical(ops::amax(x.to(kGpu), {1}), ops::amax(x, {1}));
  }
}

TEST(MaxGpu, FullMaxAndAmaxOverSeveralDims) {
  PRECIS_SKIP_WITHOUT_GPU();
  const std::vector<Reduction> cases = {{{3, 5, 7}, {0, 2}}, {{3, 5, 7}, {-1}},     {{3, 5, 7}, {}},
                                        {{3, 5, 7}, {1, 0}}, {{4099, 33}, {0}},     {{1}, {}},
                                        {{1023}, {0}},       {{2, 3, 1, 9}, {0, 3}}};
  uint64_t seed = 400;
  for (DType dtype : {DType::f32, DType::f64, DType::f16, DType::bf16, DType::i32, DType::i64}) {
    for (const Reduction& r : cases) {
      for (bool keepdim : {false, true}) {
        SCOPED_TRACE(::testing::Message() << dtype << " " << describe_reduction(r) << (keepdim ? " keepdim" : ""));
        Input x = tied_input(r.shape, dtype, Layout::dense, ++seed);
        Tensor cpu = ops::amax(x.cpu, r.dims, keepdim);
        poison(cpu.shape(), dtype);
        expect_identical(ops::amax(x.gpu, r.dims, keepdim), cpu);
      }
    }
    Input x = make_input({3, 5, 7}, dtype, Layout::transposed, ++seed, -1.0, 1.0);
    poison({}, dtype);
    expect_identical(ops::max(x.gpu), ops::max(x.cpu));
  }
}

TEST(MaxGpu, BackwardMatchesTheCpuWithTies) {
  PRECIS_SKIP_WITHOUT_GPU();
  uint64_t seed = 500;
  for (DType dtype : kFloating) {
    // max(x, dim): the gradient goes to the first maximum.
    for (const auto& [shape, dim] :
         std::vector<std::pair<Shape, int64_t>>{{{3, 5, 7}, 1}, {{3, 5, 7}, -1}, {{4099, 33}, 0}, {{7}, 0}, {{}, 0}}) {
      for (bool keepdim : {false, true}) {
        SCOPED_TRACE(::testing::Message() << "max " << dtype << " " << shape << " dim " << dim);
        Input x = tied_input(shape, dtype, Layout::dense, ++seed);
        Input g = make_input(result_shape(shape, {dim}, keepdim), dtype, Layout::dense, ++seed, -1.0, 1.0);
        Tensor xc = x.cpu.detach().set_requires_grad(), xg = x.gpu.detach().set_requires_grad();
        ops::max(xc, dim, keepdim).first.backward(g.cpu);
        poison(shape, dtype);
        ops::max(xg, dim, keepdim).first.backward(g.gpu);
        expect_identical(xg.grad(), xc.grad());
      }
    }
    // amax and max(x): ties share the gradient.
    for (const Reduction& r : std::vector<Reduction>{
             {{3, 5, 7}, {0, 2}}, {{3, 5, 7}, {}}, {{4099, 33}, {0}}, {{2, 300001}, {1}}, {{5, 1, 7}, {1}}}) {
      for (Layout layout : {Layout::dense, Layout::transposed}) {
        SCOPED_TRACE(::testing::Message()
                     << "amax " << dtype << " " << describe_reduction(r) << " " << layout_name(layout));
        Input x = tied_input(r.shape, dtype, layout, ++seed);
        Input g = make_input(result_shape(r.shape, r.dims, false), dtype, Layout::dense, ++seed, -1.0, 1.0);
        Tensor xc = x.cpu.detach().set_requires_grad(), xg = x.gpu.detach().set_requires_grad();
        ops::amax(xc, r.dims).backward(g.cpu);
        poison(r.shape, dtype);
        ops::amax(xg, r.dims).backward(g.gpu);
        expect_matches(xg.grad(), xc.grad());
      }
    }
  }
}

// ---------------------------------------------------------------- var

TEST(VarGpu, MatchesTheCpu) {
  PRECIS_SKIP_WITHOUT_GPU();
  uint64_t seed = 600;
  std::vector<Reduction> cases = {{{3, 5, 7}, {0}},       {{3, 5, 7}, {-1}}, {{3, 5, 7}, {0, 2}}, {{3, 5, 7}, {}},
                                  {{4099, 33}, {0}},      {{33, 4099}, {1}}, {{2, 300001}, {1}},  {{1023}, {0}},
                                  {{2, 3, 1, 9}, {0, 3}}, {{5, 1, 7}, {1}},  {{3, 1}, {1}}};
  for (DType dtype : kFloating) {
    for (const Reduction& r : cases) {
      for (int64_t correction : {0, 1}) {
        for (bool keepdim : {false, true}) {
          for (double center : {0.0, 100.0}) {
            SCOPED_TRACE(::testing::Message() << dtype << " " << describe_reduction(r) << " correction " << correction
                                              << (keepdim ? " keepdim" : "") << " center " << center);
            Input x = make_input(r.shape, dtype, Layout::dense, ++seed, center - 1.0, center + 1.0);
            Tensor cpu = ops::var(x.cpu, r.dims, correction, keepdim);
            poison(cpu.shape(), dtype);
            expect_matches(ops::var(x.gpu, r.dims, correction, keepdim), cpu);
          }
        }
      }
    }
    Input x = make_input({3, 5, 7}, dtype, Layout::transposed, ++seed, -1.0, 1.0);
    expect_matches(ops::var(x.gpu, {1, 2}), ops::var(x.cpu, {1, 2}));
  }
}

TEST(VarGpu, BackwardMatchesTheCpu) {
  PRECIS_SKIP_WITHOUT_GPU();
  uint64_t seed = 700;
  for (DType dtype : kFloating) {
    for (const Reduction& r : std::vector<Reduction>{
             {{3, 5, 7}, {0}}, {{3, 5, 7}, {0, 2}}, {{3, 5, 7}, {}}, {{4099, 33}, {0}}, {{2, 300001}, {1}}}) {
      for (Layout layout : {Layout::dense, Layout::transposed}) {
        SCOPED_TRACE(::testing::Message() << dtype << " " << describe_reduction(r) << " " << layout_name(layout));
        Input x = make_input(r.shape, dtype, layout, ++seed, -1.0, 1.0);
        Input g = make_input(result_shape(r.shape, r.dims, false), dtype, Layout::dense, ++seed, -1.0, 1.0);
        Tensor xc = x.cpu.detach().set_requires_grad(), xg = x.gpu.detach().set_requires_grad();
        ops::var(xc, r.dims).backward(g.cpu);
        poison(r.shape, dtype);
        ops::var(xg, r.dims).backward(g.gpu);
        expect_matches(xg.grad(), xc.grad());
      }
    }
  }
}
