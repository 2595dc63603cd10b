// sum, mean and sum_to_shape.
//
// Backward: d sum / dx = 1 for every element that went into the sum, so the
// gradient of x is the output gradient broadcast back to x's shape (with the
// reduced dims restored as size 1 first). Mean divides that by the count.
#include "core/autograd.h"
#include "ops/autocast.h"
#include "ops/checks.h"
#include "ops/cpu/loops.h"
#include "ops/cpu/reduce_rows.h"
#include "ops/cuda/reduce.h"
#include "ops/elementwise.h"
#include "ops/reduce.h"

namespace precis::ops {

namespace {

// Row sums of a dense [outer, inner] tensor, accumulated in double for accuracy.
Tensor sum_rows(const cpu::ReductionRows& r, DType dtype) {
  Tensor out = empty({r.outer}, dtype);
  cpu::dispatch_numeric(dtype, "sum", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* x = r.rows.data<T>();
    T* o = out.data<T>();
    const int64_t inner = r.inner;
#pragma omp parallel for schedule(static) if (r.outer * inner >= kParallelGrain && r.outer > 1)
    for (int64_t i = 0; i < r.outer; ++i) {
      double acc = 0;
      const T* row = x + i * inner;
      for (int64_t j = 0; j < inner; ++j) acc += convert<double>(row[j]);
      o[i] = convert<T>(acc);
    }
  });
  return out;
}

// Sums over the leading dims of a contiguous x, seen as [count, width]: out[j] = sum_i x[i, j],
// accumulated in double over i in order, the values and order in which sum_rows adds them,
// without the transposed copy reduction_rows would make first (a strided pass over all of x:
// the bias and position-embedding gradients of every step). Each task adds whole rows of its
// columns, a loop that vectorises; the columns are split among the threads.
Tensor sum_leading_dims(const Tensor& x, int64_t count, int64_t width, DType dtype) {
  constexpr int64_t kColumns = 256;  // per task: its double accumulators stay in L1
  Tensor out = empty({width}, dtype);
  cpu::dispatch_numeric(dtype, "sum", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* rows = x.data<T>();
    T* o = out.data<T>();
    const int64_t tasks = (width + kColumns - 1) / kColumns;
#pragma omp parallel for schedule(static) if (count * width >= kParallelGrain && tasks > 1)
    for (int64_t task = 0; task < tasks; ++task) {
      const int64_t j0 = task * kColumns, n = std::min(kColumns, width - j0);
      double acc[kColumns] = {};
      for (int64_t i = 0; i < count; ++i) {
        const T* row = rows + i * width + j0;
        for (int64_t j = 0; j < n; ++j) acc[j] += convert<double>(row[j]);
      }
      for (int64_t j = 0; j < n; ++j) o[j0 + j] = convert<T>(acc[j]);
    }
  });
  return out;
}

// How many leading dims `reduced` covers when it is exactly a leading run that leaves some
// dims kept (0 otherwise).
int64_t leading_reduced_dims(const std::vector<bool>& reduced) {
  int64_t lead = 0;
  while (lead < static_cast<int64_t>(reduced.size()) && reduced[lead]) ++lead;
  for (size_t d = lead; d < reduced.size(); ++d)
    if (reduced[d]) return 0;
  return lead < static_cast<int64_t>(reduced.size()) ? lead : 0;
}

// The dims a reduction over `dims` covers (every dim when empty), checked as reduction_rows checks them.
std::vector<bool> reduced_dims(const Tensor& x, const std::vector<int64_t>& dims, const char* op) {
  std::vector<bool> reduced(x.dim(), dims.empty());
  for (int64_t d : dims) {
    int64_t w = wrap_dim(d, x.dim(), op);
    if (x.dim() == 0) continue;
    PRECIS_CHECK(!reduced[w], op, ": dim ", d, " appears twice in the reduction dims");
    reduced[w] = true;
  }
  return reduced;
}

// The sums over the reduced dims, one per kept position in row-major order, on x's device.
// The CUDA kernels read x in place where its layout allows (no permuted copy).
Tensor sum_values(const Tensor& x, const std::vector<int64_t>& dims, const std::vector<bool>& reduced, const char* op) {
#if PRECIS_WITH_CUDA
  if (x.is_cuda()) return cuda::sum(x, reduced);
#endif
  if (const int64_t lead = leading_reduced_dims(reduced); lead > 0 && x.is_contiguous()) {
    int64_t count = 1, width = 1;
    for (int64_t d = 0; d < x.dim(); ++d) (d < lead ? count : width) *= x.size(d);
    return sum_leading_dims(x, count, width, x.dtype());
  }
  return sum_rows(cpu::reduction_rows(x, dims, op), x.dtype());
}

Tensor sum_impl(const Tensor& x_arg, const std::vector<int64_t>& dims, bool keepdim, double scale, const char* op) {
  const Tensor x = autocast::to_fp32(x_arg);  // autocast: reductions run in f32
  require_defined(op, x);
  DType dtype = is_floating(x.dtype()) ? x.dtype() : DType::i64;
  std::vector<bool> reduced = reduced_dims(x, dims, op);
  Shape out_shape, keep_shape;
  for (int64_t d = 0; d < x.dim(); ++d) {
    keep_shape.push_back(reduced[d] ? 1 : x.shape()[d]);
    if (!reduced[d]) out_shape.push_back(x.shape()[d]);
  }
  Tensor out = sum_values(converted(x, dtype), dims, reduced, op);
  if (scale != 1.0) {
    NoGradGuard no_grad;
    out = mul(out, scale);
  }
  const Shape& shape = keepdim ? keep_shape : out_shape;
  out = out.as_strided(shape, contiguous_strides(shape), 0);
  Shape in_shape = x.shape();
  autograd::record(op, {x}, {out}, [in_shape, keep_shape, scale](const BackwardArgs& g) {
    Tensor grad = g.grad().reshape(keep_shape).expand(in_shape);
    if (scale != 1.0) grad = mul(grad, scale);
    return std::vector<Tensor>{grad.contiguous()};
  });
  return out;
}

}  // namespace

Tensor sum(const Tensor& x) { return sum_impl(x, {}, false, 1.0, "sum"); }
Tensor sum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  return sum_impl(x, dims, keepdim, 1.0, "sum");
}

Tensor mean(const Tensor& x) { return mean(x, {}, false); }
Tensor mean(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  require_floating("mean", x);
  int64_t count = dims.empty() ? x.numel() : 1;
  for (int64_t d : dims) count *= x.size(d);
  PRECIS_CHECK(count > 0, "mean: reducing over zero elements (shape ", x.shape(), ")");
  return sum_impl(x, dims, keepdim, 1.0 / static_cast<double>(count), "mean");
}

Tensor sum_to_shape(const Tensor& x, const Shape& shape) {
  if (x.shape() == shape) return x;
  PRECIS_CHECK(x.dim() >= static_cast<int64_t>(shape.size()), "sum_to_shape: cannot reduce ", x.shape(), " to ", shape);
  size_t lead = x.shape().size() - shape.size();
  std::vector<int64_t> dims;
  for (size_t d = 0; d < x.shape().size(); ++d) {
    if (d < lead) {
      dims.push_back(static_cast<int64_t>(d));
    } else if (shape[d - lead] == 1 && x.shape()[d] != 1) {
      dims.push_back(static_cast<int64_t>(d));
    } else {
      PRECIS_CHECK(shape[d - lead] == x.shape()[d], "sum_to_shape: cannot reduce ", x.shape(), " to ", shape);
    }
  }
  if (dims.empty()) return x.reshape(shape);
  return sum(x, dims, true).reshape(shape);
}

}  // namespace precis::ops
