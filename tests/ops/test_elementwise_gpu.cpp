// GPU elementwise ops against the CPU: every unary op (and its backward), add/sub/
// mul/div with broadcasting and dtype promotion, where/masked_fill/causal_mask and
// dropout, in f32, f64, f16 and bf16 (and i32/i64 for arithmetic), on odd sizes
// (1, 7, 1023, 4099, [3, 5, 7]) and on transposed, sliced, misaligned and broadcast
// (stride 0) inputs. The CPU reference runs on the very values the GPU gets. Freed
// device blocks of each output's size are filled with NaN (or 0xAB bytes) first, so
// an output that reuses one and leaves an element unwritten fails. Dropout masks
// must equal the CPU's bit for bit. Skipped, with the reason, where no GPU is usable.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "core/copy.h"
#include "core/random.h"
#include "ops/ops.h"
#include "support/gpu.h"
#include "support/gpu_compare.h"
#include "support/gradcheck.h"

using namespace precis;
using precis::testing::expect_close;
using precis::testing::expect_matches;
using precis::testing::kCpu;
using precis::testing::kFloating;
using precis::testing::kGpu;
using precis::testing::kNaN;
using precis::testing::poison;
using precis::testing::random_f64;
using precis::testing::Tolerance;
using precis::testing::tolerance_for;

namespace {

// Bit-for-bit equality (the CPU and GPU round once, the same way).
void expect_identical(const Tensor& gpu, const Tensor& cpu) {
  ASSERT_TRUE(gpu.is_cuda());
  ASSERT_EQ(gpu.dtype(), cpu.dtype());
  ASSERT_EQ(gpu.shape(), cpu.shape());
  EXPECT_EQ(gpu.to(kCpu).to_vector<double>(), cpu.to_vector<double>());
}

// One input, the same values and the same view on both devices.
struct Input {
  Tensor cpu, gpu;
};

enum class Layout { dense, transposed, sliced, misaligned, broadcast };
const char* layout_name(Layout layout) {
  switch (layout) {
    case Layout::dense:
      return "dense";
    case Layout::transposed:
      return "transposed";
    case Layout::sliced:
      return "sliced";
    case Layout::misaligned:
      return "misaligned";
    case Layout::broadcast:
      return "broadcast";
  }
  return "?";
}

// Uniform in [low, high) rounded to `dtype`, laid out as `layout` asks: a transpose of the
// swapped last two dims, every other element of a wider last dim, a dense view one element
// into its storage (not 16-byte aligned), or a size-1 first dim expanded (stride 0).
Input make_input(const Shape& shape, DType dtype, Layout layout, uint64_t seed, double low = -1.0, double high = 1.0) {
  auto both = [&](const Shape& base_shape, const std::function<Tensor(const Tensor&)>& view) {
    Tensor base = random_f64(base_shape, seed, low, high).to(dtype);
    return Input{view(base), view(base.to(kGpu))};
  };
  const int64_t n = shape_numel(shape);
  switch (layout) {
    case Layout::dense:
      return both(shape, [](const Tensor& t) { return t; });
    case Layout::transposed: {
      Shape swapped = shape;
      std::swap(swapped[shape.size() - 1], swapped[shape.size() - 2]);
      return both(swapped, [](const Tensor& t) { return t.transpose(-1, -2); });
    }
    case Layout::sliced: {
      Shape wide = shape;
      wide.back() = 2 * shape.back() + 1;
      return both(wide, [&](const Tensor& t) { return t.slice(-1, 1, 2 * shape.back() + 1, 2); });
    }
    case Layout::misaligned:
      return both({n + 1}, [&](const Tensor& t) { return t.slice(0, 1, n + 1).view(shape); });
    case Layout::broadcast: {
      Shape narrow = shape;
      narrow[0] = 1;
      return both(narrow, [&](const Tensor& t) { return t.expand(shape); });
    }
  }
  return {};
}

std::vector<Layout> layouts_for(const Shape& shape) {
  std::vector<Layout> layouts{Layout::dense};
  if (shape.empty()) return layouts;
  layouts.push_back(Layout::sliced);
  layouts.push_back(Layout::misaligned);
  if (shape.size() >= 2) layouts.push_back(Layout::transposed);
  if (shape[0] > 1) layouts.push_back(Layout::broadcast);
  return layouts;
}

const std::vector<Shape>& odd_shapes() {
  static const std::vector<Shape> shapes = {{}, {1}, {7}, {1023}, {4099}, {3, 5, 7}, {2, 3, 1, 9}};
  return shapes;
}

struct UnaryCase {
  const char* name;
  std::function<Tensor(const Tensor&)> fn;
  double low, high;  // a range where the op and its gradient are tame
};

const std::vector<UnaryCase>& unary_cases() {
  static const std::vector<UnaryCase> cases = {
      {"neg", [](const Tensor& x) { return ops::neg(x); }, -1, 1},
      {"exp", [](const Tensor& x) { return ops::exp(x); }, -2, 2},
      {"log", [](const Tensor& x) { return ops::log(x); }, 0.5, 2},
      {"sqrt", [](const Tensor& x) { return ops::sqrt(x); }, 0.5, 2},
      {"rsqrt", [](const Tensor& x) { return ops::rsqrt(x); }, 0.5, 2},
      {"tanh", [](const Tensor& x) { return ops::tanh(x); }, -2, 2},
      {"sigmoid", [](const Tensor& x) { return ops::sigmoid(x); }, -3, 3},
      {"relu", [](const Tensor& x) { return ops::relu(x); }, -1, 1},
      {"gelu", [](const Tensor& x) { return ops::gelu(x); }, -3, 3},
      {"pow 3", [](const Tensor& x) { return ops::pow(x, 3.0); }, -2, 2},
      {"pow 2", [](const Tensor& x) { return ops::pow(x, 2.0); }, -2, 2},
      {"pow 0.5", [](const Tensor& x) { return ops::pow(x, 0.5); }, 0.5, 2},
      {"pow -1.5", [](const Tensor& x) { return ops::pow(x, -1.5); }, 0.5, 2},
      {"pow 0", [](const Tensor& x) { return ops::pow(x, 0.0); }, -1, 1},
      {"x + 1.5", [](const Tensor& x) { return x + 1.5; }, -1, 1},
      {"x - 0.25", [](const Tensor& x) { return x - 0.25; }, -1, 1},
      {"2.5 - x", [](const Tensor& x) { return 2.5 - x; }, -1, 1},
      {"x * -3", [](const Tensor& x) { return x * -3.0; }, -1, 1},
      {"x / 4", [](const Tensor& x) { return x / 4.0; }, -1, 1},
      {"2 / x", [](const Tensor& x) { return 2.0 / x; }, 0.5, 2},
  };
  return cases;
}

using BinaryFn = Tensor (*)(const Tensor&, const Tensor&);
struct BinaryCase {
  const char* name;
  BinaryFn fn;
};
const BinaryCase kBinary[] = {{"add", ops::add}, {"sub", ops::sub}, {"mul", ops::mul}, {"div", ops::div}};

// Operands of `dtype` for a binary op: integers in [-50, 50) and [1, 9) (no division by
// zero), floats in [-1, 1) and [0.5, 2) (no tiny divisor).
Input binary_operand(const Shape& shape, DType dtype, bool divisor, uint64_t seed, Layout layout = Layout::dense) {
  if (dtype == DType::i32 || dtype == DType::i64) {
    Generator gen(seed);
    Tensor t = divisor ? randint(1, 9, shape, dtype, &gen) : randint(-50, 50, shape, dtype, &gen);
    return {t, t.to(kGpu)};
  }
  return divisor ? make_input(shape, dtype, layout, seed, 0.5, 2.0) : make_input(shape, dtype, layout, seed);
}

// A bool tensor of `shape`, true with probability 1/2 (on the CPU).
Tensor random_bools(const Shape& shape, uint64_t seed) {
  std::vector<double> u = random_f64(shape, seed, 0.0, 1.0).to_vector<double>();
  std::vector<uint8_t> values(u.size());
  for (size_t i = 0; i < u.size(); ++i) values[i] = u[i] < 0.5;
  return from_vector(values, shape).to(DType::boolean);
}

}  // namespace

// ---------------------------------------------------------------- unary

TEST(UnaryGpu, ForwardMatchesTheCpuOnEveryLayout) {
  PRECIS_SKIP_WITHOUT_GPU();
  uint64_t seed = 100;
  for (const UnaryCase& op : unary_cases()) {
    for (DType dtype : kFloating) {
      for (const Shape& shape : odd_shapes()) {
        for (Layout layout : layouts_for(shape)) {
          SCOPED_TRACE(::testing::Message() << op.name << " " << dtype << " " << shape << " " << layout_name(layout));
          Input x = make_input(shape, dtype, layout, ++seed, op.low, op.high);
          poison(shape, dtype);
          expect_matches(op.fn(x.gpu), op.fn(x.cpu));
        }
      }
    }
  }
}

TEST(UnaryGpu, BackwardMatchesTheCpu) {
  PRECIS_SKIP_WITHOUT_GPU();
  uint64_t seed = 200;
  for (const UnaryCase& op : unary_cases()) {
    for (DType dtype : kFloating) {
      for (const Shape& shape : std::vector<Shape>{{7}, {4099}, {3, 5, 7}}) {
        for (Layout layout : {Layout::dense, Layout::sliced}) {
          SCOPED_TRACE(::testing::Message() << op.name << " " << dtype << " " << shape << " " << layout_name(layout));
          Input x = make_input(shape, dtype, layout, ++seed, op.low, op.high);
          Input g = make_input(shape, dtype, Layout::dense, ++seed);
          Tensor x_cpu = x.cpu.detach().set_requires_grad(), x_gpu = x.gpu.detach().set_requires_grad();
          op.fn(x_cpu).backward(g.cpu);
          poison(shape, dtype);
          op.fn(x_gpu).backward(g.gpu);
          expect_matches(x_gpu.grad(), x_cpu.grad());
        }
      }
    }
  }
}

TEST(UnaryGpu, GradientFlowsBackThroughATransposedView) {
  PRECIS_SKIP_WITHOUT_GPU();
  Tensor base = random_f64({7, 5}, 3, 0.5, 2.0).to(DType::f32);
  Tensor cpu_leaf = base.clone().set_requires_grad(), gpu_leaf = base.to(kGpu).set_requires_grad();
  auto f = [](const Tensor& t) {
    return ops::gelu(ops::tanh(ops::sqrt(t)) * ops::log(t)) + ops::sigmoid(ops::rsqrt(t));
  };
  Tensor g = random_f64({5, 7}, 4).to(DType::f32);
  f(cpu_leaf.t()).backward(g);
  f(gpu_leaf.t()).backward(g.to(kGpu));
  expect_matches(gpu_leaf.grad(), cpu_leaf.grad());
}

TEST(UnaryGpu, EdgeValuesAsOnTheCpu) {
  PRECIS_SKIP_WITHOUT_GPU();
  const double inf = std::numeric_limits<double>::infinity();
  for (DType dtype : kFloating) {
    SCOPED_TRACE(::testing::Message() << dtype);
    Tensor x = tensor({-1000, -100, -1, -0.0, 0, 1, 100, 1000, inf, -inf, kNaN}, DType::f64).to(dtype);
    for (const UnaryCase& op : unary_cases()) {
      SCOPED_TRACE(op.name);
      expect_matches(op.fn(x.to(kGpu)), op.fn(x));
    }
  }
}

TEST(UnaryGpu, IntegerTensorsWithAScalarBecomeFloat32) {
  PRECIS_SKIP_WITHOUT_GPU();
  Tensor ints = arange(-5, 6);
  expect_matches(ints.to(kGpu) * 2.5, ints * 2.5);
  expect_matches(1.0 - ints.to(kGpu), 1.0 - ints);
}

// ---------------------------------------------------------------- binary

TEST(BinaryGpu, BroadcastingMatchesTheCpuInEveryDtype) {
  PRECIS_SKIP_WITHOUT_GPU();
  const std::vector<std::pair<Shape, Shape>> shapes = {
      {{3, 5, 7}, {3, 5, 7}},
      {{4099}, {4099}},
      {{1}, {1}},
      {{3, 5, 7}, {7}},
      {{4, 1}, {1, 3}},
      {{1}, {2, 3}},
      {{2, 1, 5}, {3, 1}},
      {{}, {3, 4}},
      {{1023}, {1}},
      {{5, 1, 7}, {5, 3, 1}},
      // One row repeated over the rows (a bias, a position embedding): the packed repeated-rows
      // kernel where the row is a whole number of 16-byte packs, the strided one where not.
      {{4, 6, 8}, {6, 8}},
      {{5, 16}, {16}},
      {{4, 12}, {12}}};
  uint64_t seed = 300;
  for (const BinaryCase& op : kBinary) {
    for (DType dtype : {DType::f32, DType::f64, DType::f16, DType::bf16, DType::i32, DType::i64}) {
      for (const auto& [sa, sb] : shapes) {
        SCOPED_TRACE(::testing::Message() << op.name << " " << dtype << " " << sa << " and " << sb);
        Input a = binary_operand(sa, dtype, false, ++seed);
        Input b = binary_operand(sb, dtype, std::string(op.name) == "div", ++seed);
        poison(broadcast_shapes(sa, sb, "test"), dtype);
        expect_matches(op.fn(a.gpu, b.gpu), op.fn(a.cpu, b.cpu));
        if (std::string(op.name) == "div" && !is_floating(dtype)) continue;  // a may hold integer zeros
        poison(broadcast_shapes(sa, sb, "test"), dtype);
        expect_matches(op.fn(b.gpu, a.gpu), op.fn(b.cpu, a.cpu));
      }
    }
  }
}

TEST(BinaryGpu, StridedAndMisalignedOperands) {
  PRECIS_SKIP_WITHOUT_GPU();
  uint64_t seed = 400;
  for (const BinaryCase& op : kBinary) {
    for (DType dtype : kFloating) {
      for (Layout la : {Layout::dense, Layout::transposed, Layout::sliced, Layout::misaligned, Layout::broadcast}) {
        for (Layout lb : {Layout::dense, Layout::transposed, Layout::misaligned}) {
          SCOPED_TRACE(::testing::Message()
                       << op.name << " " << dtype << " " << layout_name(la) << " and " << layout_name(lb));
          Input a = binary_operand({3, 5, 7}, dtype, false, ++seed, la);
          Input b = binary_operand({3, 5, 7}, dtype, std::string(op.name) == "div", ++seed, lb);
          poison({3, 5, 7}, dtype);
          expect_matches(op.fn(a.gpu, b.gpu), op.fn(a.cpu, b.cpu));
        }
      }
    }
  }
}

TEST(BinaryGpu, DtypesPromoteAsOnTheCpu) {
  PRECIS_SKIP_WITHOUT_GPU();
  const std::vector<std::pair<DType, DType>> pairs = {{DType::f16, DType::f32},  {DType::bf16, DType::f16},
                                                      {DType::i64, DType::f32},  {DType::i32, DType::i64},
                                                      {DType::f64, DType::bf16}, {DType::i32, DType::f16}};
  uint64_t seed = 500;
  for (const BinaryCase& op : kBinary) {
    for (const auto& [da, db] : pairs) {
      SCOPED_TRACE(::testing::Message() << op.name << " " << da << " and " << db);
      Input a = binary_operand({4, 33}, da, false, ++seed);
      Input b = binary_operand({33}, db, true, ++seed);
      Tensor cpu = op.fn(a.cpu, b.cpu);
      poison({4, 33}, cpu.dtype());
      expect_matches(op.fn(a.gpu, b.gpu), cpu);
    }
  }
}

TEST(BinaryGpu, LargeDenseOperandsUseEveryElement) {
  PRECIS_SKIP_WITHOUT_GPU();
  for (DType dtype : kFloating) {
    for (int64_t n : {int64_t{1} << 20, (int64_t{1} << 20) + 3}) {
      SCOPED_TRACE(::testing::Message() << dtype << " n = " << n);
      Input a = make_input({n}, dtype, Layout::dense, 1), b = make_input({n}, dtype, Layout::dense, 2, 0.5, 2.0);
      poison({n}, dtype);
      expect_matches(a.gpu * b.gpu, a.cpu * b.cpu);
      poison({n}, dtype);
      expect_matches(a.gpu / b.gpu, a.cpu / b.cpu);
    }
  }
}

TEST(BinaryGpu, BackwardSumsBroadcastDimsAsTheCpu) {
  PRECIS_SKIP_WITHOUT_GPU();
  const std::vector<std::pair<Shape, Shape>> shapes = {{{3, 5, 7}, {3, 5, 7}}, {{3, 5, 7}, {7}},     {{4, 1}, {1, 3}},
                                                       {{1}, {2, 3}},          {{2, 1, 5}, {3, 1}},  {{64, 48}, {48}},
                                                       {{4099, 33}, {33}},     {{33, 1}, {33, 4099}}};
  uint64_t seed = 600;
  for (const BinaryCase& op : kBinary) {
    for (DType dtype : kFloating) {
      for (const auto& [sa, sb] : shapes) {
        SCOPED_TRACE(::testing::Message() << op.name << " " << dtype << " " << sa << " and " << sb);
        Input a = binary_operand(sa, dtype, false, ++seed);
        Input b = binary_operand(sb, dtype, true, ++seed);
        Input g = make_input(broadcast_shapes(sa, sb, "test"), dtype, Layout::dense, ++seed);
        Tensor ac = a.cpu.detach().set_requires_grad(), bc = b.cpu.detach().set_requires_grad();
        Tensor ag = a.gpu.detach().set_requires_grad(), bg = b.gpu.detach().set_requires_grad();
        op.fn(ac, bc).backward(g.cpu);
        poison(sa, dtype);
        poison(sb, dtype);
        op.fn(ag, bg).backward(g.gpu);
        // Sums over many broadcast elements of both signs: an absolute tolerance that grows
        // with the square root of their number, as the rounding error of a sum does.
        Tolerance tol = tolerance_for(dtype);
        const double atol = std::max(tol.atol, tol.rtol) * std::sqrt(static_cast<double>(g.cpu.numel()));
        ASSERT_TRUE(ag.grad().is_cuda());
        ASSERT_TRUE(bg.grad().is_cuda());
        expect_close(ag.grad().to(kCpu), ac.grad(), atol, tol.rtol);
        expect_close(bg.grad().to(kCpu), bc.grad(), atol, tol.rtol);
      }
    }
  }
}

TEST(BinaryGpu, DevicesMustMatch) {
  PRECIS_SKIP_WITHOUT_GPU();
  try {
    ops::add(ones({3}), ones({3}).to(kGpu));
    ADD_FAILURE() << "adding a CPU and a GPU tensor must fail";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("add: tensors on different devices"), std::string::npos) << e.what();
  }
}

// ---------------------------------------------------------------- where, masked_fill, causal_mask

TEST(SelectionGpu, WhereBroadcastsAndPromotesAsTheCpu) {
  PRECIS_SKIP_WITHOUT_GPU();
  uint64_t seed = 700;
  const std::vector<std::array<Shape, 3>> shapes = {{Shape{5, 1}, Shape{5, 7}, Shape{7}},
                                                    {Shape{4099}, Shape{4099}, Shape{4099}},
                                                    {Shape{3, 5, 7}, Shape{}, Shape{5, 7}},
                                                    {Shape{1}, Shape{2, 3}, Shape{1, 3}}};
  for (DType da : kFloating) {
    for (DType db : {DType::f32, DType::bf16}) {
      for (const auto& s : shapes) {
        SCOPED_TRACE(::testing::Message() << da << " and " << db << ", shapes " << s[0] << " " << s[1] << " " << s[2]);
        Tensor cond = random_bools(s[0], ++seed);
        Input a = make_input(s[1], da, Layout::dense, ++seed), b = make_input(s[2], db, Layout::dense, ++seed);
        Tensor cpu = ops::where(cond, a.cpu, b.cpu);
        poison(cpu.shape(), cpu.dtype());
        expect_identical(ops::where(cond.to(kGpu), a.gpu, b.gpu), cpu);
      }
    }
  }
  // A uint8 condition counts any nonzero byte as true; strided operands.
  Tensor bytes = from_vector(std::vector<uint8_t>{0, 2, 255, 1, 0, 7, 0}, {7});
  Input a = make_input({5, 7}, DType::f32, Layout::transposed, 1),
        b = make_input({5, 7}, DType::f32, Layout::sliced, 2);
  expect_identical(ops::where(bytes.to(kGpu), a.gpu, b.gpu), ops::where(bytes, a.cpu, b.cpu));
}

TEST(SelectionGpu, WhereBackwardMatchesTheCpu) {
  PRECIS_SKIP_WITHOUT_GPU();
  for (DType dtype : kFloating) {
    SCOPED_TRACE(::testing::Message() << dtype);
    Tensor cond = random_bools({5, 1, 7}, 1);
    Input a = make_input({3, 7}, dtype, Layout::dense, 2), b = make_input({5, 3, 1}, dtype, Layout::dense, 3);
    Input g = make_input({5, 3, 7}, dtype, Layout::dense, 4);
    Tensor ac = a.cpu.detach().set_requires_grad(), bc = b.cpu.detach().set_requires_grad();
    Tensor ag = a.gpu.detach().set_requires_grad(), bg = b.gpu.detach().set_requires_grad();
    ops::where(cond, ac, bc).backward(g.cpu);
    poison({3, 7}, dtype);
    poison({5, 3, 1}, dtype);
    ops::where(cond.to(kGpu), ag, bg).backward(g.gpu);
    expect_matches(ag.grad(), ac.grad());
    expect_matches(bg.grad(), bc.grad());
  }
}

TEST(SelectionGpu, MaskedFillWithACausalMaskMatchesTheCpu) {
  PRECIS_SKIP_WITHOUT_GPU();
  const double inf = std::numeric_limits<double>::infinity();
  for (DType dtype : kFloating) {
    for (Layout layout : {Layout::dense, Layout::transposed, Layout::broadcast}) {
      for (double value : {-inf, 0.5, -1e4}) {
        SCOPED_TRACE(::testing::Message() << dtype << " " << layout_name(layout) << " value " << value);
        Input x = make_input({2, 3, 13, 13}, dtype, layout, 5);
        Tensor mask = ops::causal_mask(13);
        Tensor cpu = ops::masked_fill(x.cpu, mask, value);
        poison(cpu.shape(), dtype);
        expect_identical(ops::masked_fill(x.gpu, ops::causal_mask(13, kGpu), value), cpu);
      }
    }
    // Backward: zero where filled, g elsewhere.
    Input x = make_input({2, 13, 13}, dtype, Layout::dense, 6), g = make_input({2, 13, 13}, dtype, Layout::dense, 7);
    Tensor xc = x.cpu.detach().set_requires_grad(), xg = x.gpu.detach().set_requires_grad();
    ops::masked_fill(xc, ops::causal_mask(13), -inf).backward(g.cpu);
    poison({2, 13, 13}, dtype);
    ops::masked_fill(xg, ops::causal_mask(13, kGpu), -inf).backward(g.gpu);
    expect_identical(xg.grad(), xc.grad());
  }
}

TEST(SelectionGpu, CausalMaskOnTheDevice) {
  PRECIS_SKIP_WITHOUT_GPU();
  for (int64_t T : {0, 1, 7, 64, 129}) {
    SCOPED_TRACE(::testing::Message() << "T = " << T);
    poison({T, T}, DType::boolean);
    Tensor mask = ops::causal_mask(T, kGpu);
    ASSERT_TRUE(mask.is_cuda());
    ASSERT_EQ(mask.dtype(), DType::boolean);
    EXPECT_EQ(mask.to(kCpu).to_vector<uint8_t>(), ops::causal_mask(T).to_vector<uint8_t>());
  }
}

// ---------------------------------------------------------------- dropout

TEST(DropoutGpu, MaskAndValuesEqualTheCpuBitForBit) {
  PRECIS_SKIP_WITHOUT_GPU();
  uint64_t seed = 800;
  for (DType dtype : kFloating) {
    for (const Shape& shape : std::vector<Shape>{{1}, {7}, {4099}, {3, 5, 7}, {64, 65}}) {
      for (Layout layout : {Layout::dense, Layout::sliced, Layout::misaligned}) {
        for (double p : {0.1, 0.5, 0.9}) {
          SCOPED_TRACE(::testing::Message() << dtype << " " << shape << " " << layout_name(layout) << " p " << p);
          Input x = make_input(shape, dtype, layout, ++seed);
          Generator cpu_gen(seed), gpu_gen(seed);
          cpu_gen.set_offset(5);
          gpu_gen.set_offset(5);
          Tensor cpu = ops::dropout(x.cpu, p, true, &cpu_gen);
          poison(shape, dtype);
          poison(shape, DType::boolean);
          expect_identical(ops::dropout(x.gpu, p, true, &gpu_gen), cpu);
          EXPECT_EQ(gpu_gen.offset(), cpu_gen.offset());
        }
      }
    }
  }
}

TEST(DropoutGpu, TransposedInputUsesTheMaskOfItsLogicalOrder) {
  PRECIS_SKIP_WITHOUT_GPU();
  Input x = make_input({33, 17}, DType::f32, Layout::transposed, 9);
  Generator a(4), b(4);
  expect_identical(ops::dropout(x.gpu, 0.3, true, &a), ops::dropout(x.cpu, 0.3, true, &b));
}

TEST(DropoutGpu, BackwardEqualsTheCpuBitForBit) {
  PRECIS_SKIP_WITHOUT_GPU();
  for (DType dtype : kFloating) {
    for (double p : {0.25, 1.0}) {
      SCOPED_TRACE(::testing::Message() << dtype << " p " << p);
      Input x = make_input({3, 5, 7}, dtype, Layout::dense, 1);
      Input g = make_input({7, 5, 3}, dtype, Layout::dense, 2);  // a transposed gradient
      Tensor xc = x.cpu.detach().set_requires_grad(), xg = x.gpu.detach().set_requires_grad();
      Generator a(21), b(21);
      ops::dropout(xc, p, true, &a).backward(g.cpu.permute({2, 1, 0}));
      poison({3, 5, 7}, dtype);
      ops::dropout(xg, p, true, &b).backward(g.gpu.permute({2, 1, 0}));
      expect_identical(xg.grad(), xc.grad());
    }
  }
}

TEST(DropoutGpu, FractionOfZerosIsCloseToP) {
  PRECIS_SKIP_WITHOUT_GPU();
  Tensor x = ones({1 << 10, 1 << 10}, DType::f32, kGpu);
  Generator gen(11);
  for (double p : {0.1, 0.5, 0.9}) {
    std::vector<float> out = ops::dropout(x, p, true, &gen).to_vector<float>();
    int64_t zeros = 0;
    for (float v : out) zeros += v == 0;
    EXPECT_NEAR(static_cast<double>(zeros) / out.size(), p, 0.005) << "p = " << p;
  }
}
