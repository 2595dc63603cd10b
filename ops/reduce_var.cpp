// var: the squared deviations from the mean summed and divided by N - correction
// (correction 1 is Bessel's unbiased estimate), as torch.var.
//
// Gradient. var = sum_i (x_i - mean)^2 / (N - c). Differentiating by x_j gives
// 2 (x_j - mean) / (N - c), plus a term through the mean, -2 / (N (N - c)) sum_i (x_i - mean),
// which vanishes because the deviations sum to zero. So dx = g * 2 (x - mean) / (N - c).
//
// Each row is summarised in pieces of at most kParallelGrain values as (count, mean,
// M2 = sum of squared deviations) and the pieces merged with Chan et al.'s pairwise
// formula: as accurate as two passes over the row, one read of memory, and a few long
// rows (a full reduction) still use every core.
#include <algorithm>
#include <vector>

#include "core/autograd.h"
#include "ops/checks.h"
#include "ops/cpu/loops.h"
#include "ops/cpu/reduce_rows.h"
#include "ops/cuda/reduce.h"
#include "ops/reduce.h"

namespace precis::ops {

namespace {

struct Moments {
  double count = 0, mean = 0, m2 = 0;
};

Moments merge(const Moments& a, const Moments& b) {
  Moments m;
  m.count = a.count + b.count;
  if (m.count == 0) return m;
  double delta = b.mean - a.mean;
  m.mean = a.mean + delta * b.count / m.count;
  m.m2 = a.m2 + b.m2 + delta * delta * a.count * b.count / m.count;
  return m;
}

// finish(row, Moments) for each row of a dense [outer, inner] layout. Long rows are cut into
// pieces of kParallelGrain values merged in order, so the result depends only on the shape.
template <typename T, typename FinishFn>
void row_moments(const T* x, int64_t outer, int64_t inner, FinishFn finish) {
  auto piece = [&](int64_t row, int64_t begin, int64_t end) {
    const T* r = x + row * inner;
    Moments m;
    m.count = static_cast<double>(end - begin);
    if (m.count == 0) return m;
    double sum = 0;
    for (int64_t j = begin; j < end; ++j) sum += convert<double>(r[j]);
    m.mean = sum / m.count;
    for (int64_t j = begin; j < end; ++j) {
      double d = convert<double>(r[j]) - m.mean;
      m.m2 += d * d;
    }
    return m;
  };
  cpu::reduce_rows_in_pieces<Moments>(outer, inner, piece, merge, finish);
}

// dx = g * 2 (x - mean) / (N - correction), with the mean of x's row recomputed.
Tensor var_backward(const Tensor& x, const Tensor& grad_in, const std::vector<int64_t>& dims, double denom) {
  cpu::ReductionRows r = cpu::reduction_rows(x, dims, "var");
  // mean and 2 g / denom of each output, broadcast back over the reduced dims.
  Shape broadcast = contiguous_strides(r.keepdim_shape);
  for (size_t d = 0; d < broadcast.size(); ++d)
    if (r.reduced[d]) broadcast[d] = 0;
#if PRECIS_WITH_CUDA
  if (x.is_cuda()) return cuda::var_backward(x, r.rows, dense(grad_in, x.dtype()), broadcast, denom);
#endif
  Tensor grad = empty(x.shape(), x.dtype());
  cpu::dispatch_floating(x.dtype(), "var", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using C = compute_type_t<T>;
    Tensor g_dense = dense(grad_in, x.dtype());
    const T* g = g_dense.data<T>();
    std::vector<C> mean(r.outer), scale(r.outer);
    row_moments(r.rows.data<T>(), r.outer, r.inner, [&](int64_t row, const Moments& m) {
      mean[row] = static_cast<C>(m.mean);
      scale[row] = static_cast<C>(2 * convert<double>(g[row]) / denom);
    });
    const T* xp = static_cast<const T*>(x.storage()->data()) + x.offset();
    T* out = grad.data<T>();
    for_each_row<3>(x.shape(), {grad.strides(), x.strides(), broadcast}, [&](auto base, int64_t n, auto inner) {
      for (int64_t i = 0; i < n; ++i) {
        int64_t k = base[2] + i * inner[2];
        out[base[0] + i * inner[0]] = convert<T>(scale[k] * (convert<C>(xp[base[1] + i * inner[1]]) - mean[k]));
      }
    });
  });
  return grad;
}

// Each row's M2 / denom, shaped `shape`, on the rows' device.
Tensor row_variances(const cpu::ReductionRows& r, const Shape& shape, DType dtype, double denom) {
#if PRECIS_WITH_CUDA
  if (r.rows.is_cuda()) return cuda::var_rows(r.rows, denom).as_strided(shape, contiguous_strides(shape), 0);
#endif
  Tensor out = empty(shape, dtype);
  cpu::dispatch_floating(dtype, "var", [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* o = out.data<T>();
    row_moments(r.rows.data<T>(), r.outer, r.inner,
                [&](int64_t row, const Moments& m) { o[row] = convert<T>(m.m2 / denom); });
  });
  return out;
}

}  // namespace

Tensor var(const Tensor& x, const std::vector<int64_t>& dims, int64_t correction, bool keepdim) {
  require_defined("var", x);
  require_floating("var", x);
  cpu::ReductionRows r = cpu::reduction_rows(x, dims, "var");
  // Like torch.var: N <= correction divides by zero (inf, or nan for a zero numerator).
  const double denom = std::max<double>(0.0, static_cast<double>(r.inner - correction));
  Shape shape = keepdim ? r.keepdim_shape : r.out_shape;
  Tensor out = row_variances(r, shape, x.dtype(), denom);
  if (autograd::any_requires_grad({&x})) {
    autograd::record("var", {x}, {out}, [x = x.detach(), dims, denom](const BackwardArgs& g) {
      return std::vector<Tensor>{var_backward(x, g.grad(), dims, denom)};
    });
  }
  return out;
}

}  // namespace precis::ops
