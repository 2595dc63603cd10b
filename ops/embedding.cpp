// embedding: a row lookup, out[n, :] = weight[idx[n], :] (indices flattened to n).
//
// Backward: each output row is a copy of one weight row, so the gradient of
// weight row v is the sum of the output-gradient rows whose index is v:
//   dweight[v, :] = sum over n with idx[n] == v of dout[n, :]
// (a scatter-add; rows never looked up get zero). Repeated indices write the
// same row, so the CPU loop is split over columns, not over n: each thread owns a
// band of columns of every row and the sums need no atomics. Each element is
// summed in the order of n, so the result does not depend on the thread count.
// The CUDA kernels (ops/cuda/embedding.cu) sort the indices instead, also
// deterministic; they check the indices on the device and report the first bad
// one with the CPU's error.
#include <algorithm>

#include "core/autograd.h"
#include "core/strided_loop.h"
#include "ops/checks.h"
#include "ops/cpu/loops.h"
#include "ops/nn_functional.h"
#include "ops/op_cost.h"
#include "ops/param_grad.h"

#if PRECIS_WITH_CUDA
#include "ops/cuda/embedding.h"
#endif

namespace precis::ops {

namespace {

void check_index(int64_t index, int64_t position, const Tensor& weight) {
  const int64_t rows = weight.shape()[0];
  PRECIS_CHECK(index >= 0 && index < rows, "embedding: index ", index, " (at position ", position,
               " of the flattened indices) is out of range for a weight of ", rows, " rows ", weight.shape(),
               "; indices must be in [0, ", rows, ")");
}

// The indices as a dense i64 vector, each checked against [0, rows).
Tensor checked_indices(const Tensor& indices, const Tensor& weight) {
  Tensor idx = dense(indices, DType::i64);
  const int64_t* p = idx.data<int64_t>();
  for (int64_t n = 0; n < idx.numel(); ++n) check_index(p[n], n, weight);
  return idx;
}

// dweight [rows, C] from dout [N, C] (dense) and idx [N]; sums in float for f16/bf16.
template <typename T>
Tensor scatter_add_rows(const Tensor& grad_rows, const Tensor& idx, int64_t rows, DType weight_dtype) {
  using Acc = compute_type_t<T>;
  const int64_t N = idx.numel(), C = grad_rows.shape()[1];
  Tensor acc = zeros({rows, C}, dtype_of<Acc>::value);
  const T* g = static_cast<const T*>(grad_rows.storage()->data()) + grad_rows.offset();
  const int64_t* ip = idx.data<int64_t>();
  Acc* a = acc.data<Acc>();
  constexpr int64_t kBand = 64;  // columns per task: wide enough for a vector loop
  const int64_t bands = (C + kBand - 1) / kBand;
#pragma omp parallel for schedule(static) if (N * C >= kParallelGrain && bands > 1)
  for (int64_t b = 0; b < bands; ++b) {
    const int64_t c0 = b * kBand, c1 = std::min(C, c0 + kBand);
    for (int64_t n = 0; n < N; ++n) {
      Acc* dst = a + ip[n] * C;
      const T* src = g + n * C;
      for (int64_t c = c0; c < c1; ++c) dst[c] += convert<Acc>(src[c]);
    }
  }
  return converted(acc, weight_dtype);
}

// out [..., C] = weight rows picked by the checked i64 indices idx; weight of any strides.
Tensor gather_rows_cpu(const Tensor& weight, const Tensor& idx, const Shape& out_shape) {
  const int64_t N = idx.numel(), C = weight.shape()[1];
  Tensor out = empty(out_shape, weight.dtype());
  cpu::dispatch_floating(weight.dtype(), "embedding", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* w = static_cast<const T*>(weight.storage()->data()) + weight.offset();
    const int64_t row_stride = weight.strides()[0], col_stride = weight.strides()[1];
    const int64_t* ip = idx.data<int64_t>();
    T* o = out.data<T>();
#pragma omp parallel for schedule(static) if (N * C >= kParallelGrain)
    for (int64_t n = 0; n < N; ++n) {
      const T* src = w + ip[n] * row_stride;
      T* dst = o + n * C;
      if (col_stride == 1) {
        std::copy(src, src + C, dst);
      } else {
        for (int64_t c = 0; c < C; ++c) dst[c] = src[c * col_stride];
      }
    }
  });
  return out;
}

}  // namespace

Tensor embedding(const Tensor& weight, const Tensor& indices) {
  require_defined("embedding", weight, "weight");
  require_defined("embedding", indices, "indices");
  const Device device = common_device("embedding", {&weight, &indices});
  require_floating("embedding", weight, "weight");
  PRECIS_CHECK(weight.dim() == 2, "embedding: weight must be [num_embeddings, embedding_dim], got ", weight.shape());
  PRECIS_CHECK(indices.dtype() == DType::i32 || indices.dtype() == DType::i64,
               "embedding: indices must be int32 or int64, got ", describe(indices));
  const int64_t N = indices.numel(), C = weight.shape()[1];
  OpScope timed("embedding", [&] { return cost::embedding(N, C, weight.dtype(), indices.dtype()); });
  Shape out_shape = indices.shape();
  out_shape.push_back(C);
  Tensor idx, out;
  if (device.is_cpu()) {
    idx = checked_indices(indices, weight);
    out = gather_rows_cpu(weight, idx, out_shape);
  } else {
#if PRECIS_WITH_CUDA
    // The kernel reads rows with unit column stride; any row stride, the indices as given (i32 or i64).
    const Tensor table = weight.strides()[1] == 1 ? weight : dense(weight, weight.dtype());
    idx = dense(indices, indices.dtype());
    out = empty(out_shape, weight.dtype(), device);
    const cuda::BadIndex bad = cuda::embedding_forward(table, idx, out);
    if (bad.position >= 0) check_index(bad.value, bad.position, weight);
#endif
  }

  if (autograd::any_requires_grad({&weight})) {
    const int64_t rows = weight.shape()[0];
    const DType dtype = weight.dtype();
    autograd::record("embedding", {weight}, {out}, [idx, rows, N, C, dtype](const BackwardArgs& g) {
      Tensor grad_rows = g.grad().reshape({N, C}).contiguous();
      Tensor dweight;
      if (idx.is_cpu()) {
        dweight = cpu::dispatch_floating(grad_rows.dtype(), "embedding backward", [&](auto tag) {
          return scatter_add_rows<typename decltype(tag)::type>(grad_rows, idx, rows, dtype);
        });
      } else {
#if PRECIS_WITH_CUDA
        // Into the weight's .grad where the engine offers it in the weight's dtype (ops/param_grad.h):
        // a 16-bit .grad (precision.grad_dtype), or an f32 weight's. GPT-2's tied wte gets the
        // lm_head product's gradient first; this adds to it, rounding the sum once.
        const ParamGrad dw = param_grad(g, 0, {dtype}, {rows, C}, dtype, idx.device());
        cuda::embedding_backward(dense(grad_rows, dtype), idx, dw.values, dw.destination.accumulate);
        dweight = dw.returned();
#endif
      }
      return std::vector<Tensor>{dweight};
    });
  }
  return out;
}

}  // namespace precis::ops
