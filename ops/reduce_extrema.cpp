// max and amax: the largest value along one dim, several dims, or all of them.
//
// Gradients. max(x, dim) picks one element per output (the first maximum), so
// d out / d x is 1 there and 0 elsewhere: the output gradient is scattered to the
// saved indices. amax and the full max(x) follow PyTorch: an output equal to k
// tied elements moves with each of them equally, so each tie gets g / k and every
// other element 0. NaN counts as the largest value (it propagates), as in PyTorch.
#include <type_traits>
#include <utility>
#include <vector>

#include "core/autograd.h"
#include "ops/checks.h"
#include "ops/cpu/loops.h"
#include "ops/cpu/reduce_rows.h"
#include "ops/cuda/reduce.h"
#include "ops/reduce.h"

namespace precis::ops {

namespace {

// True when `a` should replace the current maximum `b`: larger, or the first NaN.
template <typename C>
bool beats(C a, C b) {
  if constexpr (std::is_floating_point_v<C>)
    return a > b || (a != a && b == b);
  else
    return a > b;
}

// Whether `a` is one of the maxima equal to `m` (a NaN maximum is tied with every NaN).
template <typename C>
bool ties(C a, C m) {
  if constexpr (std::is_floating_point_v<C>)
    return a == m || (a != a && m != m);
  else
    return a == m;
}

template <typename C>
struct Best {
  C value;
  int64_t index;
};

// The first maximum of each dense row of `inner` values: finish(row, Best).
template <typename T, typename FinishFn>
void row_max(const T* x, int64_t outer, int64_t inner, FinishFn finish) {
  using C = compute_type_t<T>;
  cpu::reduce_rows_in_pieces<Best<C>>(
      outer, inner,
      [&](int64_t row, int64_t begin, int64_t end) {
        const T* r = x + row * inner;
        Best<C> best{convert<C>(r[begin]), begin};
        for (int64_t j = begin + 1; j < end; ++j) {
          C v = convert<C>(r[j]);
          if (beats(v, best.value)) best = {v, j};
        }
        return best;
      },
      [](Best<C> earlier, Best<C> later) { return beats(later.value, earlier.value) ? later : earlier; }, finish);
}

void check_input(const char* op, const Tensor& x) {
  require_defined(op, x);
  PRECIS_CHECK(is_floating(x.dtype()) || x.dtype() == DType::i32 || x.dtype() == DType::i64, op,
               ": input must be a floating or integer (int32, int64) tensor, got ", describe(x));
}

// Strides that broadcast a dense tensor of the reduction's keepdim shape back over the input.
Shape broadcast_strides(const cpu::ReductionRows& r) {
  Shape strides = contiguous_strides(r.keepdim_shape);
  for (size_t d = 0; d < strides.size(); ++d)
    if (r.reduced[d]) strides[d] = 0;
  return strides;
}

// amax's backward: each tie of the maximum gets g / (number of ties), the rest 0.
Tensor amax_backward(const Tensor& x, const Tensor& values, const Tensor& grad_in, const std::vector<int64_t>& dims,
                     const char* op) {
  cpu::ReductionRows r = cpu::reduction_rows(x, dims, op);
#if PRECIS_WITH_CUDA
  if (x.is_cuda())
    return cuda::amax_backward(x, r.rows, dense(values, x.dtype()), dense(grad_in, x.dtype()), broadcast_strides(r));
#endif
  Tensor grad = empty(x.shape(), x.dtype());
  cpu::dispatch_floating(x.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using C = compute_type_t<T>;
    Tensor m_dense = dense(values, x.dtype()), g_dense = dense(grad_in, x.dtype());
    const T* m = m_dense.data<T>();
    const T* g = g_dense.data<T>();
    const T* rows = r.rows.data<T>();
    std::vector<C> share(r.outer);
    cpu::reduce_rows_in_pieces<int64_t>(
        r.outer, r.inner,
        [&](int64_t row, int64_t begin, int64_t end) {
          const C max = convert<C>(m[row]);
          int64_t count = 0;
          for (int64_t j = begin; j < end; ++j) count += ties(convert<C>(rows[row * r.inner + j]), max);
          return count;
        },
        [](int64_t a, int64_t b) { return a + b; },
        [&](int64_t row, int64_t count) { share[row] = convert<C>(g[row]) / static_cast<C>(count); });
    const T* xp = static_cast<const T*>(x.storage()->data()) + x.offset();
    T* out = grad.data<T>();
    for_each_row<3>(x.shape(), {grad.strides(), x.strides(), broadcast_strides(r)},
                    [&](auto base, int64_t n, auto inner) {
                      for (int64_t i = 0; i < n; ++i) {
                        int64_t k = base[2] + i * inner[2];
                        bool tied = ties(convert<C>(xp[base[1] + i * inner[1]]), convert<C>(m[k]));
                        out[base[0] + i * inner[0]] = convert<T>(tied ? share[k] : C(0));
                      }
                    });
  });
  return grad;
}

// max(x, dim)'s backward: the gradient of each output goes to the element its index names.
Tensor max_backward(const Tensor& indices, const Tensor& grad_in, const Shape& shape, DType dtype, int64_t d) {
#if PRECIS_WITH_CUDA
  if (indices.is_cuda()) return cuda::max_backward(indices, dense(grad_in, dtype), shape, dtype, d);
#endif
  // A dense x is [before, n, after] around dim d; output o = (a, b) came from x[a, indices[o], b].
  const int64_t n = shape.empty() ? 1 : shape[d];
  int64_t after = 1;
  for (size_t k = d + 1; k < shape.size(); ++k) after *= shape[k];
  Tensor grad = zeros(shape, dtype);
  cpu::dispatch_floating(dtype, "max", [&](auto tag) {
    using T = typename decltype(tag)::type;
    Tensor g_dense = dense(grad_in, dtype);
    const T* g = g_dense.data<T>();
    const int64_t* idx = indices.data<int64_t>();
    T* out = grad.data<T>();
    const int64_t outer = indices.numel();
#pragma omp parallel for schedule(static) if (outer >= kParallelGrain)
    for (int64_t o = 0; o < outer; ++o) out[((o / after) * n + idx[o]) * after + o % after] = g[o];
  });
  return grad;
}

// The first maximum of each of r's rows, shaped `shape`; with their indices (i64) when `indices` is given.
Tensor row_maxima(const cpu::ReductionRows& r, const Shape& shape, DType dtype, const char* op, Tensor* indices) {
#if PRECIS_WITH_CUDA
  if (r.rows.is_cuda()) {
    std::pair<Tensor, Tensor> found = cuda::max_rows(r.rows, indices != nullptr);
    if (indices) *indices = found.second.as_strided(shape, contiguous_strides(shape), 0);
    return found.first.as_strided(shape, contiguous_strides(shape), 0);
  }
#endif
  Tensor values = empty(shape, dtype);
  if (indices) *indices = empty(shape, DType::i64);
  cpu::dispatch_numeric(dtype, op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* v = values.data<T>();
    int64_t* idx = indices ? indices->data<int64_t>() : nullptr;
    row_max(r.rows.data<T>(), r.outer, r.inner, [&](int64_t row, const auto& best) {
      v[row] = convert<T>(best.value);
      if (idx) idx[row] = best.index;
    });
  });
  return values;
}

Tensor amax_impl(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim, const char* op) {
  check_input(op, x);
  cpu::ReductionRows r = cpu::reduction_rows(x, dims, op);
  PRECIS_CHECK(r.inner > 0, op, ": cannot reduce over zero elements (input ", describe(x), ", dims ", dims,
               dims.empty() ? " = all" : "", ")");
  Shape shape = keepdim ? r.keepdim_shape : r.out_shape;
  Tensor values = row_maxima(r, shape, x.dtype(), op, nullptr);
  if (autograd::any_requires_grad({&x})) {
    autograd::record(op, {x}, {values}, [x = x.detach(), values = values.detach(), dims, op](const BackwardArgs& g) {
      return std::vector<Tensor>{amax_backward(x, values, g.grad(), dims, op)};
    });
  }
  return values;
}

}  // namespace

std::pair<Tensor, Tensor> max(const Tensor& x, int64_t dim, bool keepdim) {
  check_input("max", x);
  const int64_t d = wrap_dim(dim, x.dim(), "max");
  const int64_t n = x.dim() == 0 ? 1 : x.shape()[d];
  PRECIS_CHECK(n > 0, "max: cannot take the max over dim ", dim, " of size 0 (input ", describe(x), ")");
  cpu::ReductionRows r = cpu::reduction_rows(x, {dim}, "max");
  Shape shape = keepdim ? r.keepdim_shape : r.out_shape;
  Tensor indices;
  Tensor values = row_maxima(r, shape, x.dtype(), "max", &indices);
  if (autograd::any_requires_grad({&x})) {
    autograd::record("max", {x}, {values}, [indices, shape = x.shape(), dtype = x.dtype(), d](const BackwardArgs& g) {
      return std::vector<Tensor>{max_backward(indices, g.grad(), shape, dtype, d)};
    });
  }
  return {values, indices};
}

Tensor max(const Tensor& x) { return amax_impl(x, {}, false, "max"); }

Tensor amax(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  return amax_impl(x, dims, keepdim, "amax");
}

}  // namespace precis::ops
