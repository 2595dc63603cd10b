// add, sub, mul, div: broadcasting, dtype-promoting, tensor-tensor and tensor-scalar.
//
// Gradients (then summed back over broadcast dims to each input's shape):
//   add: da = g,      db = g
//   sub: da = g,      db = -g
//   mul: da = g * b,  db = g * a
//   div: da = g / b,  db = -g * a / b^2
#include "core/autograd.h"
#include "ops/checks.h"
#include "ops/cpu/loops.h"
#include "ops/cuda/elementwise.h"
#include "ops/elementwise.h"
#include "ops/op_cost.h"
#include "ops/reduce.h"

namespace precis::ops {

namespace {

// The gradient for an input of `shape` and `dtype` from a gradient of the broadcast shape.
Tensor reduce_grad(const Tensor& grad, const Shape& shape, DType dtype) {
  Tensor g = sum_to_shape(grad, shape);
  return g.dtype() == dtype ? g : g.to(dtype);
}

template <typename Fn>
Tensor arithmetic(const char* op, [[maybe_unused]] cuda::BinaryOp cuda_op, const Tensor& a, const Tensor& b, Fn f) {
  require_defined(op, a, "first operand");
  require_defined(op, b, "second operand");
  common_device(op, {&a, &b});
  DType dtype = promote_types(a.dtype(), b.dtype());
  if (dtype == DType::boolean || dtype == DType::u8) dtype = DType::i64;
#if PRECIS_WITH_CUDA
  if (a.is_cuda()) return cuda::binary(cuda_op, a, b, dtype);
#endif
  auto dispatch = [](DType d, const char* name, auto&& fn) { return cpu::dispatch_numeric(d, name, fn); };
  return cpu::map_binary_with(dispatch, a, b, dtype, op, f);
}

// The cost of a tensor-tensor op: its output has the broadcast shape.
OpWork binary_work(const Tensor& a, const Tensor& b) {
  return cost::binary(std::max(a.numel(), b.numel()), a.dtype(), b.dtype(), promote_types(a.dtype(), b.dtype()));
}

// Tensor-scalar ops keep a floating tensor's dtype (ints become float32), and
// compute in the compute type with the scalar unrounded, as PyTorch does.
Tensor floating_operand(const char* op, const Tensor& a) {
  require_defined(op, a);
  return is_floating(a.dtype()) ? a : a.to(DType::f32);
}

// out = f(a) with the scalar captured by f; on CUDA the kernel of `cuda_op` with `s`.
template <typename Fn>
Tensor scalar_op(const char* op, [[maybe_unused]] cuda::UnaryOp cuda_op, const Tensor& a, [[maybe_unused]] double s,
                 Fn f) {
#if PRECIS_WITH_CUDA
  if (a.is_cuda()) return cuda::unary(cuda_op, a, s);
#endif
  return cpu::map_unary(a, op, f);
}

}  // namespace

Tensor add(const Tensor& a, const Tensor& b) {
  OpScope timed("add", [&] { return binary_work(a, b); });
  Tensor out = arithmetic("add", cuda::BinaryOp::add, a, b, [](auto x, auto y) { return x + y; });
  autograd::record("add", {a, b}, {out},
                   [sa = a.shape(), sb = b.shape(), da = a.dtype(), db = b.dtype()](const BackwardArgs& g) {
                     return std::vector<Tensor>{g.needs(0) ? reduce_grad(g.grad(), sa, da) : Tensor(),
                                                g.needs(1) ? reduce_grad(g.grad(), sb, db) : Tensor()};
                   });
  return out;
}

Tensor sub(const Tensor& a, const Tensor& b) {
  OpScope timed("sub", [&] { return binary_work(a, b); });
  Tensor out = arithmetic("sub", cuda::BinaryOp::sub, a, b, [](auto x, auto y) { return x - y; });
  autograd::record("sub", {a, b}, {out},
                   [sa = a.shape(), sb = b.shape(), da = a.dtype(), db = b.dtype()](const BackwardArgs& g) {
                     return std::vector<Tensor>{g.needs(0) ? reduce_grad(g.grad(), sa, da) : Tensor(),
                                                g.needs(1) ? reduce_grad(neg(g.grad()), sb, db) : Tensor()};
                   });
  return out;
}

Tensor mul(const Tensor& a, const Tensor& b) {
  OpScope timed("mul", [&] { return binary_work(a, b); });
  Tensor out = arithmetic("mul", cuda::BinaryOp::mul, a, b, [](auto x, auto y) { return x * y; });
  if (autograd::any_requires_grad({&a, &b})) {
    autograd::record("mul", {a, b}, {out}, [a = a.detach(), b = b.detach()](const BackwardArgs& g) {
      return std::vector<Tensor>{g.needs(0) ? reduce_grad(mul(g.grad(), b), a.shape(), a.dtype()) : Tensor(),
                                 g.needs(1) ? reduce_grad(mul(g.grad(), a), b.shape(), b.dtype()) : Tensor()};
    });
  }
  return out;
}

Tensor div(const Tensor& a, const Tensor& b) {
  OpScope timed("div", [&] { return binary_work(a, b); });
  Tensor out = arithmetic("div", cuda::BinaryOp::div, a, b, [](auto x, auto y) { return x / y; });
  if (autograd::any_requires_grad({&a, &b})) {
    autograd::record("div", {a, b}, {out}, [a = a.detach(), b = b.detach()](const BackwardArgs& g) {
      Tensor grad_a = div(g.grad(), b);
      return std::vector<Tensor>{
          g.needs(0) ? reduce_grad(grad_a, a.shape(), a.dtype()) : Tensor(),
          g.needs(1) ? reduce_grad(neg(mul(grad_a, div(a, b))), b.shape(), b.dtype()) : Tensor()};
    });
  }
  return out;
}

Tensor add(const Tensor& a_in, double s) {
  Tensor a = floating_operand("add", a_in);
  Tensor out = scalar_op("add", cuda::UnaryOp::add, a, s, [s](auto x) { return x + static_cast<decltype(x)>(s); });
  autograd::record("add", {a}, {out}, [](const BackwardArgs& g) { return std::vector<Tensor>{g.grad()}; });
  return out;
}

Tensor sub(const Tensor& a, double s) { return add(a, -s); }

Tensor rsub(double s, const Tensor& b_in) {
  Tensor b = floating_operand("rsub", b_in);
  Tensor out = scalar_op("rsub", cuda::UnaryOp::rsub, b, s, [s](auto x) { return static_cast<decltype(x)>(s) - x; });
  autograd::record("rsub", {b}, {out}, [](const BackwardArgs& g) { return std::vector<Tensor>{neg(g.grad())}; });
  return out;
}

Tensor mul(const Tensor& a_in, double s) {
  Tensor a = floating_operand("mul", a_in);
  Tensor out = scalar_op("mul", cuda::UnaryOp::mul, a, s, [s](auto x) { return x * static_cast<decltype(x)>(s); });
  autograd::record("mul", {a}, {out}, [s](const BackwardArgs& g) { return std::vector<Tensor>{mul(g.grad(), s)}; });
  return out;
}

Tensor div(const Tensor& a_in, double s) {
  Tensor a = floating_operand("div", a_in);
  Tensor out = scalar_op("div", cuda::UnaryOp::div, a, s, [s](auto x) { return x / static_cast<decltype(x)>(s); });
  autograd::record("div", {a}, {out}, [s](const BackwardArgs& g) { return std::vector<Tensor>{div(g.grad(), s)}; });
  return out;
}

// d(s / b)/db = -s / b^2 = -out / b
Tensor rdiv(double s, const Tensor& b_in) {
  Tensor b = floating_operand("rdiv", b_in);
  Tensor out = scalar_op("rdiv", cuda::UnaryOp::rdiv, b, s, [s](auto x) { return static_cast<decltype(x)>(s) / x; });
  if (autograd::any_requires_grad({&b})) {
    autograd::record("rdiv", {b}, {out}, [b = b.detach(), out = out.detach()](const BackwardArgs& g) {
      return std::vector<Tensor>{neg(mul(g.grad(), div(out, b)))};
    });
  }
  return out;
}

}  // namespace precis::ops
