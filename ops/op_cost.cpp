#include "ops/op_cost.h"

namespace precis::ops::cost {

namespace {

double size(DType dtype) { return static_cast<double>(element_size(dtype)); }
double d(int64_t v) { return static_cast<double>(v); }
constexpr double kF32 = 4;

}  // namespace

OpCost elementwise(int64_t n, double flops_per_element, double read, double written) {
  return {d(n) * flops_per_element, d(n) * (read + written)};
}

OpWork binary(int64_t n, DType a_dtype, DType b_dtype, DType out_dtype) {
  const double a = size(a_dtype), b = size(b_dtype), out = size(out_dtype);
  return {elementwise(n, 1, a + b, out), elementwise(n, 2, out + a + b, a + b)};
}

OpWork unary(int64_t n, double flops, double backward_flops, DType dtype) {
  const double s = size(dtype);
  return {elementwise(n, flops, s, s), elementwise(n, backward_flops, 2 * s, s)};
}

OpWork matmul(int64_t batch, int64_t M, int64_t N, int64_t K, DType a_dtype, DType b_dtype, DType out_dtype) {
  const double mnk = d(batch) * d(M) * d(N) * d(K);
  const double a = d(batch) * d(M) * d(K) * size(a_dtype), b = d(batch) * d(K) * d(N) * size(b_dtype),
               c = d(batch) * d(M) * d(N) * size(out_dtype);
  return {{2 * mnk, a + b + c, true}, {4 * mnk, 2 * (a + b + c), true}};
}

OpWork linear(int64_t M, int64_t N, int64_t K, bool bias, bool gelu, DType dtype) {
  OpWork w = matmul(1, M, N, K, dtype, dtype, dtype);
  const double mn = d(M) * d(N);
  if (bias) {
    w.forward.flops += mn;
    w.forward.bytes += d(N) * size(dtype);
    w.backward.flops += mn;
    w.backward.bytes += d(N) * kF32;
  }
  if (gelu) {
    w.forward.flops += kGeluFlops * mn;
    w.backward.flops += kGeluBackwardFlops * mn;
    w.backward.bytes += mn * size(dtype);
  }
  return w;
}

OpWork linear_gelu_linear(int64_t M, int64_t K, int64_t H, int64_t N, DType dtype) {
  OpWork first = linear(M, H, K, true, true, dtype), second = linear(M, N, H, true, false, dtype);
  return {{first.forward.flops + second.forward.flops, first.forward.bytes + second.forward.bytes, true},
          {first.backward.flops + second.backward.flops, first.backward.bytes + second.backward.bytes, true}};
}

OpWork attention(int64_t B, int64_t H, int64_t Tq, int64_t Tk, int64_t D, bool causal, bool materialized, DType dtype) {
  const double heads = d(B) * d(H), s = size(dtype);
  const double scores = heads * d(Tq) * d(Tk) * (causal ? 0.5 : 1.0);
  const double q = heads * d(Tq) * d(D) * s, kv = heads * d(Tk) * d(D) * s, lse = heads * d(Tq) * kF32;
  OpWork w;
  w.forward = {4 * scores * d(D) + 5 * scores, 2 * q + 2 * kv + lse, true};
  // backward reads Q, K, V, O, dO and the log-sum-exp, writes dQ, dK, dV
  w.backward = {(materialized ? 8 : 10) * scores * d(D) + 4 * scores, 3 * q + 2 * kv + lse + q + 2 * kv, true};
  if (materialized) {
    const double full = heads * d(Tq) * d(Tk) * s;
    w.forward.bytes += 4 * full;
    w.backward.bytes += 3 * full;
  }
  return w;
}

OpWork layer_norm(int64_t rows, int64_t C, DType x_dtype, DType y_dtype) {
  const double n = d(rows) * d(C), params = 2 * d(C) * kF32, stats = 2 * d(rows) * kF32;
  return {{8 * n, n * (size(x_dtype) + size(y_dtype)) + params + stats},
          {14 * n, n * (size(x_dtype) + size(y_dtype) + size(x_dtype)) + stats + params + d(C) * kF32}};
}

OpWork add_layer_norm(int64_t rows, int64_t C, DType x_dtype, DType y_dtype) {
  const double n = d(rows) * d(C), params = 2 * d(C) * kF32, stats = 2 * d(rows) * kF32;
  return {{9 * n, n * (3 * size(x_dtype) + size(y_dtype)) + params + stats},
          {15 * n, n * (3 * size(x_dtype) + size(y_dtype)) + stats + params + d(C) * kF32}};
}

OpWork softmax(int64_t rows, int64_t C, DType dtype) {
  const double n = d(rows) * d(C);
  return {{5 * n, 2 * n * size(dtype)}, {4 * n, 3 * n * size(dtype)}};
}

OpWork cross_entropy(int64_t N, int64_t C, DType dtype, bool fused) {
  const double logits = d(N) * d(C), targets = d(N) * 8;
  if (fused) return {{7 * logits, 2 * logits * size(dtype) + targets + kF32}, {}};
  return {{4 * logits + d(N), logits * size(dtype) + targets + kF32}, {3 * logits, 2 * logits * size(dtype) + targets}};
}

OpWork embedding(int64_t N, int64_t C, DType dtype, DType index_dtype) {
  const double n = d(N) * d(C), indices = d(N) * size(index_dtype);
  return {{0, 2 * n * size(dtype) + indices}, {n, n * size(dtype) + indices + 2 * n * kF32}};
}

OpWork conv2d(const ConvShape& c, DType dtype) {
  const double outputs = d(c.N) * d(c.Cout) * d(c.Ho) * d(c.Wo);
  const double macs = outputs * d(c.Cin / c.groups) * d(c.kh) * d(c.kw);
  const double x = d(c.N) * d(c.Cin) * d(c.H) * d(c.W) * size(dtype),
               w = d(c.Cout) * d(c.Cin / c.groups) * d(c.kh) * d(c.kw) * size(dtype), y = outputs * size(dtype);
  const double bias = c.bias ? outputs : 0;
  return {{2 * macs + bias, x + w + y, true}, {4 * macs + bias, 2 * (x + w + y), true}};
}

OpWork batch_norm(int64_t n, int64_t C, DType dtype, bool relu) {
  const double e = d(n) * d(C), s = size(dtype);
  return {{(relu ? 9 : 8) * e, 3 * e * s + 4 * d(C) * kF32}, {9 * e, 5 * e * s + 4 * d(C) * kF32}};
}

OpWork pool(int64_t in, int64_t out, int64_t window, bool max, DType dtype) {
  const double s = size(dtype), i = d(in), o = d(out), w = d(window);
  if (max) return {{o * w, i * s + o * s + o * 4}, {0, o * s + o * 4 + i * s}};
  return {{o * w + o, i * s + o * s}, {o * w, o * s + i * s}};
}

OpCost adamw(int64_t n, DType param_dtype, DType grad_dtype, bool master) {
  const double e = d(n);
  const double moment = param_dtype == DType::f64 ? 8 : kF32;
  double bytes = e * (size(grad_dtype) + 4 * moment + 2 * size(param_dtype));
  if (master) bytes += e * (2 * kF32 - size(param_dtype));  // the master read in p's place, and written
  return {16 * e, bytes};
}

OpCost sgd(int64_t n, DType param_dtype, DType grad_dtype, bool momentum, bool master) {
  const double e = d(n);
  const double state = param_dtype == DType::f64 ? 8 : kF32;
  double bytes = e * (2 * size(param_dtype) + size(grad_dtype));
  if (momentum) bytes += 2 * e * state;
  if (master) bytes += e * (2 * kF32 - size(param_dtype));  // the master read in p's place, and written
  return {6 * e, bytes};
}

}  // namespace precis::ops::cost
