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
Tensor sum_values(const Tensor& x, const std::vector<int64_t>& dims, [[maybe_unused]] const std::vector<bool>& reduced,
                  const char* op) {
#if PRECIS_WITH_CUDA
  if (x.is_cuda()) return cuda::sum(x, reduced);
#endif
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
