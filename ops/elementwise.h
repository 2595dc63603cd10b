// Elementwise ops. Binary ops broadcast (numpy rules) and promote dtypes;
// f16/bf16 are computed in f32 and rounded on output.
#pragma once

#include "core/random.h"
#include "core/tensor.h"

namespace precis::ops {

// ---- binary, broadcasting
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);

// ---- with a scalar (the tensor's dtype is kept)
Tensor add(const Tensor& a, double b);
Tensor sub(const Tensor& a, double b);
Tensor rsub(double a, const Tensor& b);  // a - b
Tensor mul(const Tensor& a, double b);
Tensor div(const Tensor& a, double b);
Tensor rdiv(double a, const Tensor& b);  // a / b

// ---- unary
Tensor neg(const Tensor& x);
Tensor pow(const Tensor& x, double exponent);
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor sqrt(const Tensor& x);
Tensor rsqrt(const Tensor& x);
Tensor tanh(const Tensor& x);
Tensor sigmoid(const Tensor& x);
Tensor relu(const Tensor& x);
// GELU, tanh approximation (GPT-2): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
Tensor gelu(const Tensor& x);

// ---- selection and masks
// out = cond ? a : b, broadcasting all three; cond is bool (or u8).
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);
// out = mask ? value : x; mask (bool) broadcasts to x.
Tensor masked_fill(const Tensor& x, const Tensor& mask, double value);
// [T, T] bool, true above the diagonal: the positions a causal attention must not see.
Tensor causal_mask(int64_t T, Device device = Device::cpu());

// Zeroes each element with probability p and scales the rest by 1/(1-p), from
// Philox numbers of `gen` (the default generator when null). Identity when
// !training or p == 0.
Tensor dropout(const Tensor& x, double p, bool training, Generator* gen = nullptr);

// Differentiable dtype conversion (same as x.to(dtype)).
Tensor cast(const Tensor& x, DType dtype);

}  // namespace precis::ops

namespace precis {
// Operators, as PyTorch users write them.
inline Tensor operator+(const Tensor& a, const Tensor& b) { return ops::add(a, b); }
inline Tensor operator-(const Tensor& a, const Tensor& b) { return ops::sub(a, b); }
inline Tensor operator*(const Tensor& a, const Tensor& b) { return ops::mul(a, b); }
inline Tensor operator/(const Tensor& a, const Tensor& b) { return ops::div(a, b); }
inline Tensor operator+(const Tensor& a, double b) { return ops::add(a, b); }
inline Tensor operator-(const Tensor& a, double b) { return ops::sub(a, b); }
inline Tensor operator*(const Tensor& a, double b) { return ops::mul(a, b); }
inline Tensor operator/(const Tensor& a, double b) { return ops::div(a, b); }
inline Tensor operator+(double a, const Tensor& b) { return ops::add(b, a); }
inline Tensor operator-(double a, const Tensor& b) { return ops::rsub(a, b); }
inline Tensor operator*(double a, const Tensor& b) { return ops::mul(b, a); }
inline Tensor operator/(double a, const Tensor& b) { return ops::rdiv(a, b); }
inline Tensor operator-(const Tensor& x) { return ops::neg(x); }
}  // namespace precis
