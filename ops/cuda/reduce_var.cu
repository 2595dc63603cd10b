// var over rows, and its backward.
//
// Each lane folds its values into (count, mean, M2 = sum of squared deviations) with
// Welford's update, in f64 for every dtype as the CPU does:
//   count += 1;  delta = v - mean;  mean += delta / count;  M2 += delta (v - mean)
// and partial results merge with Chan et al.'s pairwise formula, the CPU's `merge`:
//   mean = mean_a + delta n_b / n,  M2 = M2_a + M2_b + delta^2 n_a n_b / n,  delta = mean_b - mean_a
// var = M2 / (N - correction). Backward: dx = g * 2 (x - mean) / (N - correction).
#include "core/cuda/convert.cuh"
#include "core/cuda/dispatch.cuh"
#include "core/cuda/launch.cuh"
#include "core/cuda/strided_index.cuh"
#include "ops/cuda/reduce.cuh"
#include "ops/cuda/reduce.h"

namespace precis::ops::cuda {

using namespace precis::cuda;  // the device toolkit (core/cuda/)

namespace {

struct Moments {
  double count, mean, m2;
};

__device__ __forceinline__ Moments merge(const Moments& a, const Moments& b) {
  const double count = a.count + b.count;
  if (count == 0) return {0, 0, 0};
  const double delta = b.mean - a.mean;
  return {count, a.mean + delta * b.count / count, a.m2 + b.m2 + delta * delta * a.count * b.count / count};
}

// The moments of each row; Finish says what to write.
template <typename T, typename Finish>
struct RowMoments {
  using Acc = Moments;
  const T* x;
  int64_t inner;
  Finish write;

  __device__ Acc identity() const { return {0, 0, 0}; }
  __device__ Acc accumulate(Acc acc, int64_t row, int64_t j) const {
    const double v = convert_to<double>(x[row * inner + j]);
    const double count = acc.count + 1, delta = v - acc.mean, mean = acc.mean + delta / count;
    return {count, mean, acc.m2 + delta * (v - mean)};
  }
  __device__ Acc combine(Acc earlier, Acc later) const { return merge(earlier, later); }
  __device__ void finish(int64_t row, Acc acc) const { write(row, acc); }
};

// var: out[row] = M2 / denom.
template <typename T>
struct WriteVariance {
  T* out;
  double denom;
  __device__ void operator()(int64_t row, const Moments& m) const { out[row] = convert_to<T>(m.m2 / denom); }
};

// For the backward: the row's mean and 2 g / denom, in the compute type (as the CPU).
template <typename T>
struct WriteMeanAndScale {
  using C = compute_t<T>;
  const T* grad;
  C* mean;
  C* scale;
  double denom;
  __device__ void operator()(int64_t row, const Moments& m) const {
    mean[row] = static_cast<C>(m.mean);
    scale[row] = static_cast<C>(2 * convert_to<double>(grad[row]) / denom);
  }
};

// out[i] = scale[k] * (x[i] - mean[k]), with x's offset and the row k from `index`.
template <typename T>
__global__ void var_backward_kernel(T* out, const T* x, const compute_t<T>* mean, const compute_t<T>* scale,
                                    StridedIndex<2> index, int64_t n) {
  precis::cuda::wait_for_previous_grid();
  precis::cuda::allow_next_grid_to_start();
  using C = compute_t<T>;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  int64_t off[2];
  index.offsets(i, off);
  out[i] = convert_to<T>(scale[off[1]] * (convert_to<C>(x[off[0]]) - mean[off[1]]));
}

}  // namespace

Tensor var_rows(const Tensor& rows, double denom) {
  PRECIS_CHECK(rows.dim() == 2 && rows.is_contiguous(), "var: expected dense [outer, inner] rows, got ",
               describe(rows));
  const int64_t outer = rows.shape()[0], inner = rows.shape()[1];
  Tensor out = empty({outer}, rows.dtype(), rows.device());
  dispatch_floating(rows.dtype(), "var", [&](auto tag) {
    using T = typename decltype(tag)::type;
    RowMoments<T, WriteVariance<T>> r{data_of<const T>(rows), inner, {data_of<T>(out), denom}};
    reduce_rows("var", r, outer, inner, rows.device());
  });
  return out;
}

Tensor var_backward(const Tensor& x_in, const Tensor& rows, const Tensor& grad, const Shape& broadcast_strides,
                    double denom) {
  const int64_t outer = rows.shape()[0], inner = rows.shape()[1];
  PRECIS_CHECK(grad.numel() == outer && grad.is_contiguous(), "var: expected one dense gradient per row");
  Tensor x = x_in;
  Tensor out = empty(x.shape(), x.dtype(), x.device());
  dispatch_floating(x.dtype(), "var", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using C = compute_t<T>;
    Tensor stats = empty({2 * outer * static_cast<int64_t>(sizeof(C))}, DType::u8, x.device());
    C* mean = static_cast<C*>(stats.raw_data());
    C* scale = mean + outer;
    RowMoments<T, WriteMeanAndScale<T>> r{data_of<const T>(rows), inner, {data_of<const T>(grad), mean, scale, denom}};
    reduce_rows("var", r, outer, inner, x.device());
    const int64_t n = x.numel();
    if (n == 0) return;
    const StridedIndex<2> index = backward_index(x, broadcast_strides, "var");
    precis::cuda::launch(var_backward_kernel<T>, precis::cuda::grid_for(n), precis::cuda::kBlockSize, 0,
                         stream_for(out), data_of<T>(out), data_of<const T>(x), mean, scale, index, n);
    PRECIS_CUDA_CHECK_LAUNCH("var");
  });
  return out;
}

}  // namespace precis::ops::cuda
