// Unary elementwise ops. Each forward is one elementwise pass (a CPU loop or a CUDA
// kernel). neg and exp write their backward with ops; the others compute g * f'(saved)
// in one fused pass over the incoming gradient and the saved tensor (x, or y = f(x)).
//   neg:     d(-x)      = -g
//   exp:     d exp(x)   = g * y                                  (saves the output)
//   pow:     d x^e      = g * e * x^(e-1), and 0 when e == 0      (saves the input)
//   log:     d log(x)   = g / x                                  (saves the input)
//   sqrt:    d sqrt(x)  = g * 0.5 / y                            (saves the output)
//   rsqrt:   d x^-1/2   = g * -0.5 x^-3/2 = g * -0.5 y^3         (saves the output)
//   tanh:    d tanh(x)  = g * (1 - y^2)                          (saves the output)
//   sigmoid: d s(x)     = g * y * (1 - y)                        (saves the output)
//   relu:    d max(x,0) = g * [x > 0]                            (saves the input)
//   gelu:    with u = k (x + c x^3), t = tanh(u), k = sqrt(2/pi), c = 0.044715:
//            d 0.5 x (1 + t) = g * (0.5 (1 + t) + 0.5 x (1 - t^2) k (1 + 3 c x^2))   (saves the input)
//   cast:    x.to(dtype), whose backward converts g back to x's dtype
#include <algorithm>
#include <cmath>

#include "core/autograd.h"
#include "ops/autocast.h"
#include "ops/checks.h"
#include "ops/cpu/gelu.h"
#include "ops/cpu/loops.h"
#include "ops/cuda/elementwise.h"
#include "ops/elementwise.h"
#include "ops/op_cost.h"

namespace precis::ops {

namespace {
Tensor checked_input(const char* op, const Tensor& x) {
  require_defined(op, x);
  require_floating(op, x);
  return x;
}

// out = f(x) on x's device: the CUDA kernel of `cuda_op` (with `scalar`) or the CPU loop of f.
template <typename Fn>
Tensor apply_unary(const char* op, [[maybe_unused]] cuda::UnaryOp cuda_op, const Tensor& x,
                   [[maybe_unused]] double scalar, Fn f) {
#if PRECIS_WITH_CUDA
  if (x.is_cuda()) return cuda::unary(cuda_op, x, scalar);
#endif
  return cpu::map_unary(x, op, f);
}

// Records `op` with a backward of g * derivative(saved), computed in saved's dtype
// (f16/bf16 in f32). `saved` is x or the output, as the derivative wants. On CUDA the
// same pass is the fused kernel of `cuda_op` (with `scalar`).
template <typename Derivative>
void record_unary(const char* op, [[maybe_unused]] cuda::UnaryOp cuda_op, [[maybe_unused]] double scalar,
                  const Tensor& x, const Tensor& out, const Tensor& saved, Derivative derivative) {
  if (!autograd::any_requires_grad({&x})) return;
  autograd::record(op, {x}, {out}, [=, saved = saved.detach()](const BackwardArgs& g) {
#if PRECIS_WITH_CUDA
    if (saved.is_cuda()) return std::vector<Tensor>{cuda::unary_backward(cuda_op, g.grad(), saved, scalar)};
#endif
    return std::vector<Tensor>{cpu::map_binary(g.grad(), saved, saved.dtype(), op,
                                               [derivative](auto grad, auto s) { return grad * derivative(s); })};
  });
}

}  // namespace

Tensor neg(const Tensor& x) {
  checked_input("neg", x);
  Tensor out = apply_unary("neg", cuda::UnaryOp::neg, x, 0.0, [](auto v) { return -v; });
  autograd::record("neg", {x}, {out}, [](const BackwardArgs& g) { return std::vector<Tensor>{neg(g.grad())}; });
  return out;
}

Tensor exp(const Tensor& x_arg) {
  const Tensor x = autocast::to_fp32(x_arg);  // autocast: exp runs in f32
  checked_input("exp", x);
  Tensor out = apply_unary("exp", cuda::UnaryOp::exp, x, 0.0, [](auto v) { return std::exp(v); });
  if (autograd::any_requires_grad({&x})) {
    autograd::record("exp", {x}, {out},
                     [out = out.detach()](const BackwardArgs& g) { return std::vector<Tensor>{mul(g.grad(), out)}; });
  }
  return out;
}

Tensor pow(const Tensor& x, double exponent) {
  checked_input("pow", x);
  Tensor out = exponent == 2.0 ? apply_unary("pow", cuda::UnaryOp::square, x, exponent, [](auto v) { return v * v; })
                               : apply_unary("pow", cuda::UnaryOp::pow, x, exponent, [exponent](auto v) {
                                   return std::pow(v, static_cast<decltype(v)>(exponent));
                                 });
  record_unary("pow", cuda::UnaryOp::pow, exponent, x, out, x, [exponent](auto v) {
    using C = decltype(v);
    if (exponent == 0.0) return C(0);
    return static_cast<C>(exponent) * std::pow(v, static_cast<C>(exponent - 1.0));
  });
  return out;
}

Tensor log(const Tensor& x_arg) {
  const Tensor x = autocast::to_fp32(x_arg);  // autocast: log runs in f32
  checked_input("log", x);
  Tensor out = apply_unary("log", cuda::UnaryOp::log, x, 0.0, [](auto v) { return std::log(v); });
  record_unary("log", cuda::UnaryOp::log, 0.0, x, out, x, [](auto v) { return decltype(v)(1) / v; });
  return out;
}

Tensor sqrt(const Tensor& x) {
  checked_input("sqrt", x);
  Tensor out = apply_unary("sqrt", cuda::UnaryOp::sqrt, x, 0.0, [](auto v) { return std::sqrt(v); });
  record_unary("sqrt", cuda::UnaryOp::sqrt, 0.0, x, out, out, [](auto y) { return decltype(y)(0.5) / y; });
  return out;
}

Tensor rsqrt(const Tensor& x) {
  checked_input("rsqrt", x);
  Tensor out = apply_unary("rsqrt", cuda::UnaryOp::rsqrt, x, 0.0, [](auto v) { return decltype(v)(1) / std::sqrt(v); });
  record_unary("rsqrt", cuda::UnaryOp::rsqrt, 0.0, x, out, out, [](auto y) { return decltype(y)(-0.5) * y * y * y; });
  return out;
}

Tensor tanh(const Tensor& x) {
  checked_input("tanh", x);
  Tensor out = apply_unary("tanh", cuda::UnaryOp::tanh, x, 0.0, [](auto v) { return std::tanh(v); });
  record_unary("tanh", cuda::UnaryOp::tanh, 0.0, x, out, out, [](auto y) { return decltype(y)(1) - y * y; });
  return out;
}

// 1 / (1 + e^-x): for very negative x, e^-x overflows to inf and the result is 0, as it should be.
Tensor sigmoid(const Tensor& x) {
  checked_input("sigmoid", x);
  Tensor out = apply_unary("sigmoid", cuda::UnaryOp::sigmoid, x, 0.0,
                           [](auto v) { return decltype(v)(1) / (decltype(v)(1) + std::exp(-v)); });
  record_unary("sigmoid", cuda::UnaryOp::sigmoid, 0.0, x, out, out, [](auto y) { return y * (decltype(y)(1) - y); });
  return out;
}

// std::max(v, 0) returns v when v is NaN, so NaNs propagate as in PyTorch.
Tensor relu(const Tensor& x) {
  checked_input("relu", x);
  OpScope timed("relu", [&] { return cost::unary(x.numel(), 1, 1, x.dtype()); });
  Tensor out = apply_unary("relu", cuda::UnaryOp::relu, x, 0.0, [](auto v) { return std::max(v, decltype(v)(0)); });
  record_unary("relu", cuda::UnaryOp::relu, 0.0, x, out, x,
               [](auto v) { return v > decltype(v)(0) ? decltype(v)(1) : decltype(v)(0); });
  return out;
}

Tensor gelu(const Tensor& x) {
  checked_input("gelu", x);
  OpScope timed("gelu", [&] { return cost::unary(x.numel(), cost::kGeluFlops, cost::kGeluBackwardFlops, x.dtype()); });
  // The formula of ops/cpu/gelu.h, which the fused linear kernels share.
  Tensor out = apply_unary("gelu", cuda::UnaryOp::gelu, x, 0.0, [](auto v) { return cpu::gelu(v); });
  record_unary("gelu", cuda::UnaryOp::gelu, 0.0, x, out, x, [](auto v) { return cpu::gelu_derivative(v); });
  return out;
}

Tensor cast(const Tensor& x, DType dtype) {
  require_defined("cast", x);
  return x.to(dtype);
}

}  // namespace precis::ops
