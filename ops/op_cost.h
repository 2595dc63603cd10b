// The cost model of the ops, in one place: for each op, the floating-point
// operations (FLOPs) and the bytes it moves to and from memory, forward and
// backward, as functions of its shapes and dtypes. The op profile
// (core/op_profile.h) places every op on the roofline with them
// (docs/profiling.md, "The cost model").
//
// Conventions:
// - A multiply-add is 2 FLOPs. Elementwise work counts the arithmetic of the
//   formula (exp, tanh, sqrt count 1 each), stated per element below.
// - Bytes are the minimum traffic of the fused kernel the op launches on a GPU:
//   each input read once and each output written once, at its dtype's size
//   (sizes `s`, `s_out`, ... below are bytes per element). Reads that a cache
//   absorbs (a weight reused by every row) are counted once. So achieved GB/s is
//   a lower bound of what the memory really served.
// - The backward cost is that of the gradients the op's backward computes when
//   every input needs one.
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "core/op_profile.h"

namespace precis::ops::cost {

// Elementwise work on `n` elements: `flops_per_element` each, reading `read` and writing
// `written` bytes per element.
OpCost elementwise(int64_t n, double flops_per_element, double read, double written);

// out = a (op) b on n outputs (add, sub, mul, div): 1 FLOP each; bytes: read a and b, write out.
// backward: g times the other operand (mul, div) or g itself (add, sub), reduced where an
// operand was broadcast: 2 FLOPs per element; bytes: read g, a and b, write da and db.
OpWork binary(int64_t n, DType a_dtype, DType b_dtype, DType out_dtype);

// out = f(x) on n elements, `flops` each; backward dx = dy f'(x): `backward_flops` each,
// reading dy and x, writing dx.
OpWork unary(int64_t n, double flops, double backward_flops, DType dtype);

// C[batch, M, N] = A[batch, M, K] @ B[batch, K, N] (a_dtype, b_dtype in, out_dtype out).
// forward: 2 batch M N K FLOPs; bytes batch (M K s_a + K N s_b + M N s_out).
// backward: dA = dC B^T and dB = A^T dC, 4 batch M N K FLOPs; bytes: read dC twice, A and B,
// write dA and dB: batch (2 M N s_out + 2 M K s_a + 2 K N s_b).
OpWork matmul(int64_t batch, int64_t M, int64_t N, int64_t K, DType a_dtype, DType b_dtype, DType out_dtype);

// y[M, N] = x[M, K] W^T (+ b) (then gelu, when `gelu`): a product with its epilogue fused.
// forward: 2 M N K, + M N for the bias, + kGeluFlops M N for gelu; bytes x, W, b, y.
// backward: the product's 4 M N K, + M N for the bias gradient (column sums of dy),
// + kGeluBackwardFlops M N for gelu's; bytes: the product's, + b's gradient; with gelu the
// pre-activation saved forward is read back (M N s).
OpWork linear(int64_t M, int64_t N, int64_t K, bool bias, bool gelu, DType dtype);

// A transformer MLP: linear(gelu(linear(x, W1, b1)), W2, b2), x [M, K], hidden [M, H], out [M, N]:
// the sum of its two linears (the first with gelu).
OpWork linear_gelu_linear(int64_t M, int64_t K, int64_t H, int64_t N, DType dtype);

// Attention over B H heads, Tq queries, Tk keys, head size D.
// forward: S = Q K^T (2 Tq Tk D) and O = P V (2 Tq Tk D): 4 B H Tq Tk D FLOPs, halved when
// causal (Tq = Tk: only the lower triangle is computed), + 5 per score for the softmax.
// Flash (`materialized` false) reads Q, K, V and writes O and the row log-sum-exp (f32):
// B H (Tq D + 2 Tk D + Tq D) s + 4 B H Tq bytes. The reference path also writes the scores
// and the probabilities and reads them back: + 4 B H Tq Tk s.
// backward: flash recomputes S, then dV = P^T dO, dP = dO V^T, dQ = dS K, dK = dS^T Q: five
// products, 10 B H Tq Tk D (halved when causal), + 4 per score for dS = P (dP - rowsum(dO O));
// bytes: read Q, K, V, O, dO and the log-sum-exp, write dQ, dK, dV. The reference path (no
// recomputation) does four products, 8 B H Tq Tk D, and reads P and writes dS: + 3 B H Tq Tk s.
OpWork attention(int64_t B, int64_t H, int64_t Tq, int64_t Tk, int64_t D, bool causal, bool materialized, DType dtype);

// Layer norm of `rows` rows of C: x in x_dtype, y out y_dtype, f32 weight and bias.
// forward: mean (1), variance (3: subtract, square, add), normalise (2), affine (2): 8 rows C
// FLOPs; bytes rows C (s_x + s_y) + 2 C 4 (weight, bias) + 2 rows 4 (mean and 1/std saved).
// backward: x_hat recomputed (2), dx_hat = dy w (1), dw and db sums (3), two row sums (4),
// dx = rstd (dx_hat - mean(dx_hat) - x_hat mean(dx_hat x_hat)) (4): 14 rows C; bytes: read x,
// dy (y's dtype), mean, 1/std and w, write dx, dw, db.
OpWork layer_norm(int64_t rows, int64_t C, DType x_dtype, DType y_dtype);

// sum = x + residual (+ bias), normed = layer_norm(sum): one more FLOP per element forward
// and the incoming gradient of `sum` added backward (1 per element); bytes: read x and
// residual, write sum and normed (f32 weight and bias); backward reads both gradients and the sum,
// writes dx (the residual's gradient is the same tensor).
OpWork add_layer_norm(int64_t rows, int64_t C, DType x_dtype, DType y_dtype);

// (log-)softmax of rows of C: max (1), subtract (1), exp (1), sum (1), divide or log (1):
// 5 rows C; bytes 2 rows C s. backward: dx = y (dy - sum(dy y)): 4 rows C, read y and dy,
// write dx: 3 rows C s.
OpWork softmax(int64_t rows, int64_t C, DType dtype);

// Cross-entropy of N rows of C logits (i64 targets): log-softmax (4 per logit: max, subtract,
// exp, sum) and the picked log-probability; bytes N C s + 8 N + 4. backward: softmax - one-hot
// scaled (3 per logit: exp recomputed, subtract, scale), read the logits, write their gradient:
// 2 N C s. `fused` (cross_entropy_with_grad): the loss and the gradient in one pass: all in
// the forward (7 per logit; read and write N C s), no backward.
OpWork cross_entropy(int64_t N, int64_t C, DType dtype, bool fused);

// GELU (tanh form): x^3 (2), multiply-add (2), scale (1), tanh (1), 1 + (1), x/2 times (2).
constexpr double kGeluFlops = 8;
// Its derivative from x (tanh recomputed, sech^2, the chain rule) times dy.
constexpr double kGeluBackwardFlops = 14;

// out[i, :] = weight[index[i], :] for N indices of C columns: no FLOPs; bytes: read N
// indices (s_index) and N C s, write N C s. backward: scatter-add of dy into the f32 weight
// gradient: N C FLOPs, read dy (N C s) and the indices, read and write N C f32 gradient rows.
OpWork embedding(int64_t N, int64_t C, DType dtype, DType index_dtype);

// Convolution: x [N, Cin, H, W], w [Cout, Cin/groups, kh, kw], y [N, Cout, Ho, Wo].
// forward: 2 N Cout Ho Wo (Cin/groups) kh kw FLOPs (+ N Cout Ho Wo for a bias); bytes x, w, y.
// backward: dx and dw, each a product of the forward's size: twice the forward FLOPs
// (+ the bias gradient's N Cout Ho Wo); bytes: read x, w, dy twice, write dx, dw.
struct ConvShape {
  int64_t N, Cin, H, W, Cout, kh, kw, Ho, Wo, groups = 1;
  bool bias = false;
};
OpWork conv2d(const ConvShape& c, DType dtype);

// Batch norm (training) of n = N H W elements per channel, C channels: statistics (mean 1,
// variance 3), normalise and affine (4), + 1 with a fused relu: 8 (9) n C FLOPs; bytes: x read
// twice (statistics pass, normalise pass), y written. backward: sums of dy and dy x_hat (4),
// dx (5): 9 n C; bytes: x and dy read twice, dx written.
OpWork batch_norm(int64_t n, int64_t C, DType dtype, bool relu);

// Pooling: `out` outputs of a window of `window` inputs each, `in` inputs; max compares (1 per
// input of a window) and saves the argmax (i32), average adds (1 per input) and scales (1).
// forward: out window (+ out for average) FLOPs; bytes in s + out s (+ 4 out indices).
// backward: max routes each dy to its argmax (0 FLOPs; read dy and the indices, write dx);
// average spreads dy / window over the window (out window; read dy, write dx).
OpWork pool(int64_t in, int64_t out, int64_t window, bool max, DType dtype);

// One AdamW step on n parameters (param_dtype) with grad_dtype gradients, f32 moments (f64 for
// f64 parameters), an f32 master copy when the parameters are lower precision (`master`). Per
// element: m update (3), v update (4), bias corrections (2), sqrt + eps + divide (3), decoupled
// weight decay (2), the update (2): 16 FLOPs. Bytes: read g, m, v and p (or, with a master
// copy, the master in its place); write p, m, v (and the master).
OpCost adamw(int64_t n, DType param_dtype, DType grad_dtype, bool master);

// One SGD step on n parameters (param_dtype) with grad_dtype gradients, an f32 (f64 for f64
// parameters) momentum buffer when `momentum`, an f32 master copy when `master`. Per element:
// weight decay (2), momentum (2), the update (2): 6 FLOPs. Bytes: read g; read and write p
// (with a master copy: read and write the master, write p), the momentum buffer.
OpCost sgd(int64_t n, DType param_dtype, DType grad_dtype, bool momentum, bool master);

}  // namespace precis::ops::cost
