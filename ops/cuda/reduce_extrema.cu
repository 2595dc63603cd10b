// max and amax over rows, and their backward passes.
//
// Forward: the first maximum of each row, NaN counting as the largest value (it
// propagates), as the CPU and PyTorch. Each lane keeps the first maximum of the
// values it reads; two partial results keep the larger value, and on a tie the
// smaller index, so the tree finds the first maximum whatever its shape.
//
// Backward:
//   max(x, dim):  dx[a, indices[a, b], b] = g[a, b], 0 elsewhere
//   amax:         dx = g / k at each of the k elements tied with the row's maximum, 0 elsewhere
#include <type_traits>

#include "core/copy.h"
#include "core/cuda/convert.cuh"
#include "core/cuda/dispatch.cuh"
#include "core/cuda/launch.cuh"
#include "core/cuda/strided_index.cuh"
#include "ops/cuda/reduce.cuh"
#include "ops/cuda/reduce.h"

namespace precis::ops::cuda {

using namespace precis::cuda;  // the device toolkit (core/cuda/)

namespace {

// True when `a` should replace the current maximum `b`: larger, or the first NaN.
template <typename C>
__device__ __forceinline__ bool beats(C a, C b) {
  if constexpr (std::is_floating_point_v<C>)
    return a > b || (a != a && b == b);
  else
    return a > b;
}

// Whether `a` is one of the maxima equal to `m` (a NaN maximum is tied with every NaN).
template <typename C>
__device__ __forceinline__ bool ties(C a, C m) {
  if constexpr (std::is_floating_point_v<C>)
    return a == m || (a != a && m != m);
  else
    return a == m;
}

template <typename C>
struct Best {
  C value;
  int64_t index;  // -1: no value seen yet
};

template <typename T>
struct MaxRows {
  using C = compute_t<T>;
  using Acc = Best<C>;
  const T* x;
  T* values;
  int64_t* indices;  // null when not wanted
  int64_t inner;

  __device__ Acc identity() const { return {C(0), -1}; }
  __device__ Acc accumulate(Acc acc, int64_t row, int64_t j) const {
    // A lane reads its values in increasing j, so only a strictly better value replaces the best.
    const C v = convert_to<C>(x[row * inner + j]);
    return acc.index < 0 || beats(v, acc.value) ? Acc{v, j} : acc;
  }
  __device__ Acc combine(Acc earlier, Acc later) const {
    if (earlier.index < 0) return later;
    if (later.index < 0) return earlier;
    if (beats(later.value, earlier.value)) return later;
    if (beats(earlier.value, later.value)) return earlier;
    return later.index < earlier.index ? later : earlier;
  }
  __device__ void finish(int64_t row, Acc acc) const {
    values[row] = convert_to<T>(acc.value);
    if (indices) indices[row] = acc.index;
  }
};

// Counts the elements of each row tied with its maximum m, then share = g / count.
template <typename T>
struct TieShare {
  using C = compute_t<T>;
  using Acc = int64_t;
  const T* x;
  const T* maxima;
  const T* grad;
  C* share;
  int64_t inner;

  __device__ Acc identity() const { return 0; }
  __device__ Acc accumulate(Acc acc, int64_t row, int64_t j) const {
    return acc + ties(convert_to<C>(x[row * inner + j]), convert_to<C>(maxima[row]));
  }
  __device__ Acc combine(Acc earlier, Acc later) const { return earlier + later; }
  __device__ void finish(int64_t row, Acc count) const {
    share[row] = convert_to<C>(grad[row]) / static_cast<C>(count);
  }
};

// out[i] = x[i] ties m[k] ? share[k] : 0, with x's offset and the row k from `index`.
template <typename T>
__global__ void amax_backward_kernel(T* out, const T* x, const T* maxima, const compute_t<T>* share,
                                     StridedIndex<2> index, int64_t n) {
  precis::cuda::wait_for_previous_grid();
  precis::cuda::allow_next_grid_to_start();
  using C = compute_t<T>;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  int64_t off[2];
  index.offsets(i, off);
  const bool tied = ties(convert_to<C>(x[off[0]]), convert_to<C>(maxima[off[1]]));
  out[i] = convert_to<T>(tied ? share[off[1]] : C(0));
}

// Output o = (a, b) around dim d (`after` = the size of b) came from x[a, indices[o], b], n = x's size along d.
template <typename T>
__global__ void max_backward_kernel(T* out, const T* grad, const int64_t* indices, int64_t outputs, int64_t n,
                                    int64_t after) {
  precis::cuda::wait_for_previous_grid();
  precis::cuda::allow_next_grid_to_start();
  const int64_t o = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (o >= outputs) return;
  out[((o / after) * n + indices[o]) * after + o % after] = grad[o];
}

}  // namespace

std::pair<Tensor, Tensor> max_rows(const Tensor& rows, bool with_indices) {
  PRECIS_CHECK(rows.dim() == 2 && rows.is_contiguous(), "max: expected dense [outer, inner] rows, got ",
               describe(rows));
  const int64_t outer = rows.shape()[0], inner = rows.shape()[1];
  Tensor values = empty({outer}, rows.dtype(), rows.device());
  Tensor indices = with_indices ? empty({outer}, DType::i64, rows.device()) : Tensor();
  dispatch_numeric(rows.dtype(), "max", [&](auto tag) {
    using T = typename decltype(tag)::type;
    MaxRows<T> r{data_of<const T>(rows), data_of<T>(values), with_indices ? data_of<int64_t>(indices) : nullptr, inner};
    reduce_rows("max", r, outer, inner, rows.device());
  });
  return {values, indices};
}

Tensor amax_backward(const Tensor& x_in, const Tensor& rows, const Tensor& values, const Tensor& grad,
                     const Shape& broadcast_strides) {
  const int64_t outer = rows.shape()[0], inner = rows.shape()[1];
  PRECIS_CHECK(values.numel() == outer && grad.numel() == outer && values.is_contiguous() && grad.is_contiguous(),
               "max: expected one dense maximum and gradient per row");
  Tensor x = x_in;
  Tensor out = empty(x.shape(), x.dtype(), x.device());
  dispatch_floating(x.dtype(), "max", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using C = compute_t<T>;
    Tensor share = empty({outer * static_cast<int64_t>(sizeof(C))}, DType::u8, x.device());
    C* share_data = static_cast<C*>(share.raw_data());
    TieShare<T> r{data_of<const T>(rows), data_of<const T>(values), data_of<const T>(grad), share_data, inner};
    reduce_rows("max", r, outer, inner, x.device());
    const int64_t n = x.numel();
    if (n == 0) return;
    const StridedIndex<2> index = backward_index(x, broadcast_strides, "max");
    precis::cuda::launch(amax_backward_kernel<T>, precis::cuda::grid_for(n), precis::cuda::kBlockSize, 0,
                         stream_for(out), data_of<T>(out), data_of<const T>(x), data_of<const T>(values), share_data,
                         index, n);
    PRECIS_CUDA_CHECK_LAUNCH("max");
  });
  return out;
}

Tensor max_backward(const Tensor& indices, const Tensor& grad, const Shape& shape, DType dtype, int64_t dim) {
  const int64_t n = shape.empty() ? 1 : shape[dim];
  int64_t after = 1;
  for (size_t k = dim + 1; k < shape.size(); ++k) after *= shape[k];
  Tensor out = zeros(shape, dtype, grad.device());
  const int64_t outputs = indices.numel();
  if (outputs == 0) return out;
  PRECIS_CHECK(grad.numel() == outputs && grad.is_contiguous() && grad.dtype() == dtype && indices.is_contiguous(),
               "max: expected one dense gradient per output");
  dispatch_floating(dtype, "max", [&](auto tag) {
    using T = typename decltype(tag)::type;
    precis::cuda::launch(max_backward_kernel<T>, precis::cuda::grid_for(outputs), precis::cuda::kBlockSize, 0,
                         stream_for(out), data_of<T>(out), data_of<const T>(grad), data_of<const int64_t>(indices),
                         outputs, n, after);
  });
  PRECIS_CUDA_CHECK_LAUNCH("max");
  return out;
}

}  // namespace precis::ops::cuda
