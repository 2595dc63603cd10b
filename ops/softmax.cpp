// softmax and log_softmax along one dim, made stable by subtracting the row max m
// (then exp(x - m) <= 1 never overflows):
//   softmax(x)_i     = exp(x_i - m) / s,    s = sum_j exp(x_j - m)
//   log_softmax(x)_i = x_i - m - log s
// Gradients, with y the output and g its gradient:
//   softmax:     dy_i/dx_j = y_i (δ_ij - y_j),  so dx_j = y_j (g_j - sum_i g_i y_i)
//   log_softmax: dy_i/dx_j = δ_ij - exp(y_j),   so dx_j = g_j - exp(y_j) sum_i g_i
// Both save only the output. Computed in f32 (f64 for f64) and rounded to the input dtype.
//
// A dense tensor of shape [before, n, after] around `dim` holds before * after rows of n
// values with stride `after`; they are read in place, so no dim needs a transpose.
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "core/autograd.h"
#include "ops/autocast.h"
#include "ops/checks.h"
#include "ops/cpu/loops.h"
#include "ops/nn_functional.h"

namespace precis::ops {

namespace {

struct Rows {
  int64_t count = 1;   // before * after
  int64_t n = 1;       // values per row (the size of dim)
  int64_t stride = 1;  // distance between a row's values (after)
  int64_t base(int64_t row) const { return (row / stride) * n * stride + row % stride; }
};

Rows rows_along(const Shape& shape, int64_t dim) {
  Rows rows;
  if (shape.empty()) return rows;  // a scalar is one row of one value
  for (int64_t d = 0; d < static_cast<int64_t>(shape.size()); ++d) {
    if (d < dim) rows.count *= shape[d];
    if (d > dim) rows.stride *= shape[d];
  }
  rows.n = shape[dim];
  rows.count *= rows.stride;
  return rows;
}

// Calls fn(base, unit_stride) for every row, in parallel. unit_stride is a
// std::integral_constant so the dense last-dim case compiles to its own, vectorisable, loops.
template <typename Fn>
void for_each_softmax_row(const Rows& rows, Fn fn) {
  auto run = [&](auto unit) {
#pragma omp parallel for schedule(static) if (rows.count * rows.n >= kParallelGrain && rows.count > 1)
    for (int64_t r = 0; r < rows.count; ++r) fn(rows.base(r), unit);
  };
  if (rows.stride == 1)
    run(std::true_type{});
  else
    run(std::false_type{});
}

// A per-thread buffer of at least n values, reused from row to row.
template <typename C>
C* scratch(int64_t n) {
  thread_local std::vector<C> buffer;
  if (static_cast<int64_t>(buffer.size()) < n) buffer.resize(n);
  return buffer.data();
}

// `t` as a dense tensor of `dtype`, copied only when needed. No autograd.
Tensor dense(const Tensor& t, DType dtype) {
  if (t.dtype() == dtype && t.is_contiguous()) return t;
  Tensor out = empty(t.shape(), dtype);
  copy_(out, t);
  return out;
}

template <typename T>
void softmax_forward(const T* x, T* y, const Rows& rows, bool log) {
  using C = compute_type_t<T>;
  const int64_t n = rows.n;
  for_each_softmax_row(rows, [&](int64_t base, auto unit) {
    const int64_t s = decltype(unit)::value ? 1 : rows.stride;
    const T* xr = x + base;
    T* yr = y + base;
    C* e = scratch<C>(n);
    C m = -std::numeric_limits<C>::infinity();
    for (int64_t i = 0; i < n; ++i) {
      e[i] = convert<C>(xr[i * s]);
      m = std::max(m, e[i]);
    }
    C sum = 0;
    if (log) {
      for (int64_t i = 0; i < n; ++i) sum += std::exp(e[i] - m);
      // (x - m) - log s, not x - (m + log s): m + log s would round away log s when m is large.
      const C log_sum = std::log(sum);
      for (int64_t i = 0; i < n; ++i) yr[i * s] = convert<T>((e[i] - m) - log_sum);
    } else {
      for (int64_t i = 0; i < n; ++i) {
        e[i] = std::exp(e[i] - m);
        sum += e[i];
      }
      const C inv = C(1) / sum;
      for (int64_t i = 0; i < n; ++i) yr[i * s] = convert<T>(e[i] * inv);
    }
  });
}

template <typename T>
void softmax_backward(const T* y, const T* g, T* dx, const Rows& rows, bool log) {
  using C = compute_type_t<T>;
  const int64_t n = rows.n;
  for_each_softmax_row(rows, [&](int64_t base, auto unit) {
    const int64_t s = decltype(unit)::value ? 1 : rows.stride;
    const T* yr = y + base;
    const T* gr = g + base;
    T* dr = dx + base;
    C acc = 0;
    if (log) {
      for (int64_t i = 0; i < n; ++i) acc += convert<C>(gr[i * s]);
      for (int64_t i = 0; i < n; ++i)
        dr[i * s] = convert<T>(convert<C>(gr[i * s]) - std::exp(convert<C>(yr[i * s])) * acc);
    } else {
      for (int64_t i = 0; i < n; ++i) acc += convert<C>(gr[i * s]) * convert<C>(yr[i * s]);
      for (int64_t i = 0; i < n; ++i) dr[i * s] = convert<T>(convert<C>(yr[i * s]) * (convert<C>(gr[i * s]) - acc));
    }
  });
}

Tensor softmax_impl(const Tensor& x_arg, int64_t dim, bool log, const char* op) {
  const Tensor x_in = autocast::to_fp32(x_arg);  // autocast: softmax runs in f32
  require_defined(op, x_in);
  require_cpu(op, {&x_in});
  require_floating(op, x_in);
  const Rows rows = rows_along(x_in.shape(), wrap_dim(dim, x_in.dim(), op));
  Tensor x = dense(x_in, x_in.dtype());
  Tensor y = empty(x.shape(), x.dtype());
  cpu::dispatch_floating(x.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (x.numel() > 0) softmax_forward(x.data<T>(), y.data<T>(), rows, log);
  });
  if (autograd::any_requires_grad({&x_in})) {
    autograd::record(op, {x_in}, {y}, [y = y.detach(), rows, log, op](const BackwardArgs& g) {
      Tensor dx = empty(y.shape(), y.dtype());
      cpu::dispatch_floating(y.dtype(), op, [&](auto tag) {
        using T = typename decltype(tag)::type;
        Tensor g_dense = dense(g.grad(), y.dtype());
        if (y.numel() > 0) softmax_backward(y.data<T>(), g_dense.data<T>(), dx.data<T>(), rows, log);
      });
      return std::vector<Tensor>{dx};
    });
  }
  return y;
}

}  // namespace

Tensor softmax(const Tensor& x, int64_t dim) { return softmax_impl(x, dim, false, "softmax"); }
Tensor log_softmax(const Tensor& x, int64_t dim) { return softmax_impl(x, dim, true, "log_softmax"); }

}  // namespace precis::ops
