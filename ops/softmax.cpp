// softmax and log_softmax along one dim, made stable by subtracting the row max m
// (then exp(x - m) <= 1 never overflows):
//   softmax(x)_i     = exp(x_i - m) / s,    s = sum_j exp(x_j - m)
//   log_softmax(x)_i = x_i - m - log s
// Gradients, with y the output and g its gradient:
//   softmax:     dy_i/dx_j = y_i (δ_ij - y_j),  so dx_j = y_j (g_j - sum_i g_i y_i)
//   log_softmax: dy_i/dx_j = δ_ij - exp(y_j),   so dx_j = g_j - exp(y_j) sum_i g_i
// Both save only the output. Computed in f32 (f64 for f64) and rounded to the input dtype.
//
// On the CPU, a dense tensor of shape [before, n, after] around `dim` holds before * after
// rows of n values with stride `after`; they are read in place, so no dim needs a transpose.
// The CUDA kernels (ops/cuda/softmax.cu) take rows along the last dim; another dim is
// moved last with a dense permuted copy and the result moved back.
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "core/autograd.h"
#include "ops/autocast.h"
#include "ops/checks.h"
#include "ops/cpu/loops.h"
#include "ops/nn_functional.h"
#include "ops/op_cost.h"

#if PRECIS_WITH_CUDA
#include "ops/cuda/softmax.h"
#endif

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

template <typename T>
void softmax_forward(const T* x, T* y, const Rows& rows, bool log) {
  using C = compute_type_t<T>;
  const int64_t n = rows.n;
  for_each_softmax_row(rows, [&](int64_t base, auto unit) {
    const int64_t s = decltype(unit)::value ? 1 : rows.stride;
    const T* xr = x + base;
    T* yr = y + base;
    C* e = cpu::scratch<C>(n);
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

Tensor softmax_forward_cpu(const Tensor& x_in, const Rows& rows, bool log, const char* op) {
  Tensor x = dense(x_in, x_in.dtype());
  Tensor y = empty(x.shape(), x.dtype());
  cpu::dispatch_floating(x.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (x.numel() > 0) softmax_forward(x.data<T>(), y.data<T>(), rows, log);
  });
  return y;
}

Tensor softmax_backward_cpu(const Tensor& y, const Tensor& grad, const Rows& rows, bool log, const char* op) {
  Tensor dx = empty(y.shape(), y.dtype());
  cpu::dispatch_floating(y.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    Tensor g = dense(grad, y.dtype());
    if (y.numel() > 0) softmax_backward(y.data<T>(), g.data<T>(), dx.data<T>(), rows, log);
  });
  return dx;
}

#if PRECIS_WITH_CUDA
// A view of `t` with `dim` and the last dim swapped (itself when dim is the last). No autograd.
Tensor swap_with_last(const Tensor& t, int64_t dim) {
  const int64_t last = t.dim() - 1;
  if (t.dim() == 0 || dim == last) return t;
  Shape shape = t.shape(), strides = t.strides();
  std::swap(shape[dim], shape[last]);
  std::swap(strides[dim], strides[last]);
  return t.as_strided(shape, strides, t.offset());
}

// `t` (with dim moved last) back in the layout of the input: dense, dim in its place.
Tensor moved_back(const Tensor& t, int64_t dim) { return dense(swap_with_last(t, dim), t.dtype()); }

// y with `dim` moved last (dense), which is what the backward kernel reads.
Tensor softmax_forward_cuda(const Tensor& x_in, int64_t dim, bool log) {
  Tensor x = dense(swap_with_last(x_in, dim), x_in.dtype());
  Tensor y = empty(x.shape(), x.dtype(), x.device());
  cuda::softmax_forward(x, y, log);
  return y;
}

Tensor softmax_backward_cuda(const Tensor& y_last, const Tensor& grad, int64_t dim, bool log) {
  Tensor g = dense(swap_with_last(grad, dim), y_last.dtype());
  Tensor dx = empty(y_last.shape(), y_last.dtype(), y_last.device());
  cuda::softmax_backward(y_last, g, dx, log);
  return moved_back(dx, dim);
}
#endif

Tensor softmax_impl(const Tensor& x_arg, int64_t dim, bool log, const char* op) {
  const Tensor x_in = autocast::to_fp32(x_arg);  // autocast: softmax runs in f32
  require_defined(op, x_in);
  common_device(op, {&x_in});
  require_floating(op, x_in);
  const int64_t d = wrap_dim(dim, x_in.dim(), op);
  OpScope timed(op, [&] {
    const int64_t C = x_in.dim() == 0 ? 1 : x_in.size(d);
    return cost::softmax(x_in.numel() / std::max<int64_t>(C, 1), C, x_in.dtype());
  });
  // What the backward reads: y itself on the CPU, y with d moved last on the GPU.
  Tensor y, saved;
  if (x_in.is_cpu()) {
    y = saved = softmax_forward_cpu(x_in, rows_along(x_in.shape(), d), log, op);
  } else {
#if PRECIS_WITH_CUDA
    saved = softmax_forward_cuda(x_in, d, log);
    y = moved_back(saved, d);
#endif
  }
  if (autograd::any_requires_grad({&x_in})) {
    autograd::record(op, {x_in}, {y}, [saved = saved.detach(), d, log, op](const BackwardArgs& g) {
      Tensor dx;
      if (saved.is_cpu()) {
        dx = softmax_backward_cpu(saved, g.grad(), rows_along(saved.shape(), d), log, op);
      } else {
#if PRECIS_WITH_CUDA
        dx = softmax_backward_cuda(saved, g.grad(), d, log);
#endif
      }
      return std::vector<Tensor>{dx};
    });
  }
  return y;
}

}  // namespace

Tensor softmax(const Tensor& x, int64_t dim) { return softmax_impl(x, dim, false, "softmax"); }
Tensor log_softmax(const Tensor& x, int64_t dim) { return softmax_impl(x, dim, true, "log_softmax"); }

}  // namespace precis::ops
