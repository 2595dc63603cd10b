// CUDA kernels of the elementwise ops (ops/elementwise_*.cpp, ops/selection.cpp),
// callable from plain C++: validation, autocast and autograd stay in the op files,
// which call these for CUDA tensors. Inputs may have any strides; results are new
// dense tensors on the inputs' device. f16/bf16 are computed in f32 and rounded on
// store, f64 in f64: the same arithmetic as the CPU kernels.
#pragma once

#include "core/tensor.h"

namespace precis::ops::cuda {

enum class UnaryOp {
  neg,
  exp,
  log,
  sqrt,
  rsqrt,
  tanh,
  sigmoid,
  relu,
  gelu,    // tanh approximation
  pow,     // x^scalar
  square,  // x * x (pow with exponent 2, exact as the CPU's)
  add,     // x + scalar
  mul,     // x * scalar
  div,     // x / scalar
  rsub,    // scalar - x
  rdiv,    // scalar / x
};

// op(x) for a floating x, in x's dtype; `scalar` is the exponent or the other operand.
Tensor unary(UnaryOp op, const Tensor& x, double scalar = 0.0);

// The fused backward of the ops whose CPU backward is one pass over (grad, saved):
// grad * op'(saved) in saved's dtype, where saved is the input (pow, log, relu, gelu)
// or the output (sqrt, rsqrt, tanh, sigmoid) as the CPU's record_unary saves it.
Tensor unary_backward(UnaryOp op, const Tensor& grad, const Tensor& saved, double scalar = 0.0);

enum class BinaryOp { add, sub, mul, div };

// a op b with numpy broadcasting, both converted to `dtype` (f32, f64, f16, bf16, i32, i64).
Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b, DType dtype);

// cond ? a : b with cond (bool or u8), a and b broadcast to one shape; a and b converted to `dtype`.
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b, DType dtype);

// x where (cond != 0) == when, else `value` (rounded to x's dtype); cond broadcasts with x.
// masked_fill is where_scalar(mask, x, false, value); the selection gradients use value 0.
Tensor where_scalar(const Tensor& cond, const Tensor& x, bool when, double value);

// [T, T] bool on `device`, true above the diagonal.
Tensor causal_mask(int64_t T, Device device);

}  // namespace precis::ops::cuda
