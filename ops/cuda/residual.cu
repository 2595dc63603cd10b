// add_relu's kernels (ops/cuda/residual.h): one thread per element, in memory order.
#include "core/cuda/convert.cuh"
#include "core/cuda/dispatch.cuh"
#include "core/cuda/launch.cuh"
#include "ops/cuda/residual.h"

namespace precis::ops::cuda {

using namespace precis::cuda;  // the device toolkit (core/cuda/)

namespace {

// y = max(0, x + r), summed in the compute type (a NaN stays NaN, as std::max(v, 0) on the CPU)
template <typename T>
__global__ void add_relu_kernel(const T* x, const T* r, T* y, int64_t n) {
  wait_for_previous_grid();
  allow_next_grid_to_start();
  using C = compute_t<T>;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const C v = convert_to<C>(x[i]) + convert_to<C>(r[i]);
  y[i] = convert_to<T>(v < C(0) ? C(0) : v);
}

template <typename T>
__global__ void relu_mask_kernel(const T* g, const T* y, T* dx, int64_t n) {
  wait_for_previous_grid();
  allow_next_grid_to_start();
  using C = compute_t<T>;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  dx[i] = convert_to<C>(y[i]) > C(0) ? g[i] : convert_to<T>(C(0));
}

}  // namespace

void add_relu_forward(const Tensor& x, const Tensor& residual, const Tensor& y) {
  const int64_t n = y.numel();
  if (n == 0) return;
  dispatch_floating(y.dtype(), "add_relu", [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch(add_relu_kernel<T>, grid_for(n), kBlockSize, 0, stream_for(y), data_of<const T>(x),
           data_of<const T>(residual), data_of<T>(y), n);
  });
  PRECIS_CUDA_CHECK_LAUNCH("add_relu");
}

void relu_mask(const Tensor& g, const Tensor& y, const Tensor& dx) {
  const int64_t n = y.numel();
  if (n == 0) return;
  dispatch_floating(y.dtype(), "add_relu backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch(relu_mask_kernel<T>, grid_for(n), kBlockSize, 0, stream_for(dx), data_of<const T>(g), data_of<const T>(y),
           data_of<T>(dx), n);
  });
  PRECIS_CUDA_CHECK_LAUNCH("add_relu backward");
}

}  // namespace precis::ops::cuda
