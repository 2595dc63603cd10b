// Unary elementwise ops and the fused backward of those whose gradient is one
// pass over (grad, saved), as in ops/elementwise_unary.cpp. The formulas are the
// CPU's, term for term:
//   neg -x   exp e^x   log ln x   sqrt   rsqrt 1/sqrt(x)   tanh   sigmoid 1/(1+e^-x)
//   relu max(x, 0) (NaN stays NaN)   gelu 0.5 x (1 + tanh(k (x + c x^3))), k = sqrt(2/pi), c = 0.044715
//   pow x^e   square x*x   and x+s, x*s, x/s, s-x, s/x with a scalar s
// Backward, g * f'(saved):
//   pow  e x^(e-1) (0 when e == 0)   log 1/x   sqrt 0.5/y   rsqrt -0.5 y^3   tanh 1 - y^2
//   sigmoid y (1 - y)   relu [x > 0]   gelu 0.5 (1 + t) + 0.5 x (1 - t^2) k (1 + 3 c x^2), t = tanh(k (x + c x^3))
#include <type_traits>

#include "ops/cuda/compute_math.cuh"
#include "ops/cuda/elementwise.cuh"
#include "ops/cuda/elementwise.h"

namespace precis::ops::cuda {

using namespace precis::cuda;  // the device toolkit (core/cuda/)

namespace {

template <UnaryOp op>
struct UnaryForward {
  double scalar;

  template <typename C>
  __device__ __forceinline__ C operator()(C v) const {
    if constexpr (op == UnaryOp::neg) {
      return -v;
    } else if constexpr (op == UnaryOp::exp) {
      return exp_of(v);
    } else if constexpr (op == UnaryOp::log) {
      return log_of(v);
    } else if constexpr (op == UnaryOp::sqrt) {
      return sqrt_of(v);
    } else if constexpr (op == UnaryOp::rsqrt) {
      return C(1) / sqrt_of(v);
    } else if constexpr (op == UnaryOp::tanh) {
      return tanh_of(v);
    } else if constexpr (op == UnaryOp::sigmoid) {
      return C(1) / (C(1) + exp_of(-v));
    } else if constexpr (op == UnaryOp::relu) {
      return v < C(0) ? C(0) : v;  // std::max(v, 0): NaN compares false and stays
    } else if constexpr (op == UnaryOp::gelu) {
      return gelu_tanh(v);
    } else if constexpr (op == UnaryOp::pow) {
      return pow_of(v, static_cast<C>(scalar));
    } else if constexpr (op == UnaryOp::square) {
      return v * v;
    } else if constexpr (op == UnaryOp::add) {
      return v + static_cast<C>(scalar);
    } else if constexpr (op == UnaryOp::mul) {
      return v * static_cast<C>(scalar);
    } else if constexpr (op == UnaryOp::div) {
      return v / static_cast<C>(scalar);
    } else if constexpr (op == UnaryOp::rsub) {
      return static_cast<C>(scalar) - v;
    } else {
      static_assert(op == UnaryOp::rdiv);
      return static_cast<C>(scalar) / v;
    }
  }
};

// g * f'(s), where s is what the op saved (its input or its output).
template <UnaryOp op>
struct UnaryBackward {
  double scalar;

  template <typename C>
  __device__ __forceinline__ C derivative(C s) const {
    if constexpr (op == UnaryOp::pow) {
      if (scalar == 0.0) return C(0);
      return static_cast<C>(scalar) * pow_of(s, static_cast<C>(scalar - 1.0));
    } else if constexpr (op == UnaryOp::log) {
      return C(1) / s;
    } else if constexpr (op == UnaryOp::sqrt) {
      return C(0.5) / s;
    } else if constexpr (op == UnaryOp::rsqrt) {
      return C(-0.5) * s * s * s;
    } else if constexpr (op == UnaryOp::tanh) {
      return C(1) - s * s;
    } else if constexpr (op == UnaryOp::sigmoid) {
      return s * (C(1) - s);
    } else if constexpr (op == UnaryOp::relu) {
      return s > C(0) ? C(1) : C(0);
    } else {
      static_assert(op == UnaryOp::gelu);
      return gelu_tanh_grad(s);
    }
  }

  template <typename C>
  __device__ __forceinline__ C operator()(C grad, C s) const {
    return grad * derivative(s);
  }
};

const char* name_of(UnaryOp op) {
  switch (op) {
    case UnaryOp::neg:
      return "neg";
    case UnaryOp::exp:
      return "exp";
    case UnaryOp::log:
      return "log";
    case UnaryOp::sqrt:
      return "sqrt";
    case UnaryOp::rsqrt:
      return "rsqrt";
    case UnaryOp::tanh:
      return "tanh";
    case UnaryOp::sigmoid:
      return "sigmoid";
    case UnaryOp::relu:
      return "relu";
    case UnaryOp::gelu:
      return "gelu";
    case UnaryOp::pow:
    case UnaryOp::square:
      return "pow";
    case UnaryOp::add:
      return "add";
    case UnaryOp::mul:
      return "mul";
    case UnaryOp::div:
      return "div";
    case UnaryOp::rsub:
      return "rsub";
    case UnaryOp::rdiv:
      return "rdiv";
  }
  return "unary";
}

template <UnaryOp op>
Tensor forward(const Tensor& x, double scalar) {
  Tensor out = empty(x.shape(), x.dtype(), x.device());
  dispatch_floating(x.dtype(), name_of(op), [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch_map<T, 1>(name_of(op), out, {x}, UnaryForward<op>{scalar});
  });
  return out;
}

template <UnaryOp op>
Tensor backward(const Tensor& grad, const Tensor& saved, double scalar) {
  Tensor out = empty(saved.shape(), saved.dtype(), saved.device());
  dispatch_floating(saved.dtype(), name_of(op), [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch_map<T, 2>(name_of(op), out, {converted(grad, saved.dtype()), saved}, UnaryBackward<op>{scalar});
  });
  return out;
}

}  // namespace

Tensor unary(UnaryOp op, const Tensor& x, double scalar) {
  switch (op) {
    case UnaryOp::neg:
      return forward<UnaryOp::neg>(x, scalar);
    case UnaryOp::exp:
      return forward<UnaryOp::exp>(x, scalar);
    case UnaryOp::log:
      return forward<UnaryOp::log>(x, scalar);
    case UnaryOp::sqrt:
      return forward<UnaryOp::sqrt>(x, scalar);
    case UnaryOp::rsqrt:
      return forward<UnaryOp::rsqrt>(x, scalar);
    case UnaryOp::tanh:
      return forward<UnaryOp::tanh>(x, scalar);
    case UnaryOp::sigmoid:
      return forward<UnaryOp::sigmoid>(x, scalar);
    case UnaryOp::relu:
      return forward<UnaryOp::relu>(x, scalar);
    case UnaryOp::gelu:
      return forward<UnaryOp::gelu>(x, scalar);
    case UnaryOp::pow:
      return forward<UnaryOp::pow>(x, scalar);
    case UnaryOp::square:
      return forward<UnaryOp::square>(x, scalar);
    case UnaryOp::add:
      return forward<UnaryOp::add>(x, scalar);
    case UnaryOp::mul:
      return forward<UnaryOp::mul>(x, scalar);
    case UnaryOp::div:
      return forward<UnaryOp::div>(x, scalar);
    case UnaryOp::rsub:
      return forward<UnaryOp::rsub>(x, scalar);
    case UnaryOp::rdiv:
      return forward<UnaryOp::rdiv>(x, scalar);
  }
  PRECIS_FAIL("unary: unknown op");
}

Tensor unary_backward(UnaryOp op, const Tensor& grad, const Tensor& saved, double scalar) {
  PRECIS_CHECK(grad.shape() == saved.shape(), name_of(op), ": gradient of shape ", grad.shape(),
               " for a saved tensor of shape ", saved.shape());
  switch (op) {
    case UnaryOp::pow:
      return backward<UnaryOp::pow>(grad, saved, scalar);
    case UnaryOp::log:
      return backward<UnaryOp::log>(grad, saved, scalar);
    case UnaryOp::sqrt:
      return backward<UnaryOp::sqrt>(grad, saved, scalar);
    case UnaryOp::rsqrt:
      return backward<UnaryOp::rsqrt>(grad, saved, scalar);
    case UnaryOp::tanh:
      return backward<UnaryOp::tanh>(grad, saved, scalar);
    case UnaryOp::sigmoid:
      return backward<UnaryOp::sigmoid>(grad, saved, scalar);
    case UnaryOp::relu:
      return backward<UnaryOp::relu>(grad, saved, scalar);
    case UnaryOp::gelu:
      return backward<UnaryOp::gelu>(grad, saved, scalar);
    default:
      PRECIS_FAIL(name_of(op), ": no fused CUDA backward (its backward is written with ops)");
  }
}

}  // namespace precis::ops::cuda
