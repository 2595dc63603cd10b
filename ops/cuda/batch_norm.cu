// batch_norm on the GPU (ops/cuda/batch_norm.h): cuDNN's spatial batch norm (legacy API,
// cudnn_ops), and the two relu passes of batch_norm_relu over dense buffers (the same memory
// format on both sides, so an element's position is the same in each).
//   cuDNN's running-variance update uses the unbiased batch variance (PyTorch's rule,
//   ops/batch_norm.cpp); it saves the batch mean and 1 / sqrt(var + eps) for its backward.
#include "core/cuda/convert.cuh"
#include "core/cuda/dispatch.cuh"
#include "core/cuda/launch.cuh"
#include "ops/cuda/batch_norm.h"
#include "ops/cuda/cudnn.h"

namespace precis::ops::cuda {

using namespace precis::cuda;  // the device toolkit (core/cuda/)

namespace {

constexpr cudnnBatchNormMode_t kMode = CUDNN_BATCHNORM_SPATIAL;

// y = max(y, 0) in place (a NaN stays NaN, as std::max(y, 0) on the CPU).
template <typename T>
__global__ void relu_in_place_kernel(T* y, int64_t n) {
  wait_for_previous_grid();
  allow_next_grid_to_start();
  using C = compute_t<T>;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const C v = convert_to<C>(y[i]);
  if (v < C(0)) y[i] = convert_to<T>(C(0));
}

// out = y > 0 ? gy : 0
template <typename T>
__global__ void relu_mask_kernel(T* out, const T* gy, const T* y, int64_t n) {
  wait_for_previous_grid();
  allow_next_grid_to_start();
  using C = compute_t<T>;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  out[i] = convert_to<C>(y[i]) > C(0) ? gy[i] : convert_to<T>(C(0));
}

void check_eps(double eps, const char* op) {
  PRECIS_CHECK(eps >= CUDNN_BN_MIN_EPSILON, op, ": eps must be at least ", CUDNN_BN_MIN_EPSILON,
               " on the GPU (cuDNN's bound), got ", eps);
}

void* data_or_null(const Tensor& t) { return t.defined() ? t.raw_data() : nullptr; }

void relu_in_place(const Tensor& y) {
  const int64_t n = y.numel();
  if (n == 0) return;
  dispatch_floating(y.dtype(), "batch_norm_relu", [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch(relu_in_place_kernel<T>, grid_for(n), kBlockSize, 0, stream_for(y), data_of<T>(y), n);
  });
  PRECIS_CUDA_CHECK_LAUNCH("batch_norm_relu");
}

}  // namespace

void batch_norm_forward(const BatchNormForward& f) {
  const char* op = f.relu ? "batch_norm_relu" : "batch_norm";
  check_eps(f.eps, op);
  cudnnHandle_t h = cudnn::handle(f.x.device());
  cudnn::TensorDesc x_desc, stats_desc;
  cudnn::set_image(x_desc, f.x, f.format, op);
  PRECIS_CUDNN_CHECK(cudnnDeriveBNTensorDescriptor(stats_desc.get(), x_desc.get(), kMode), op,
                     ": describing the statistics of ", describe(f.x));
  if (f.training) {
    PRECIS_CUDNN_CHECK(
        cudnnBatchNormalizationForwardTraining(
            h, kMode, cudnn::kOne.get(), cudnn::kZero.get(), x_desc.get(), f.x.raw_data(), x_desc.get(), f.y.raw_data(),
            stats_desc.get(), f.weight.raw_data(), f.bias.raw_data(), f.momentum, data_or_null(f.running_mean),
            data_or_null(f.running_var), f.eps, f.save_mean.raw_data(), f.save_invstd.raw_data()),
        op, ": training forward of ", describe(f.x));
  } else {
    PRECIS_CUDNN_CHECK(cudnnBatchNormalizationForwardInference(
                           h, kMode, cudnn::kOne.get(), cudnn::kZero.get(), x_desc.get(), f.x.raw_data(), x_desc.get(),
                           f.y.raw_data(), stats_desc.get(), f.weight.raw_data(), f.bias.raw_data(),
                           f.running_mean.raw_data(), f.running_var.raw_data(), f.eps),
                       op, ": eval forward of ", describe(f.x));
  }
  if (f.relu) relu_in_place(f.y);
}

void batch_norm_backward(const BatchNormBackward& b) {
  check_eps(b.eps, "batch_norm");
  cudnnHandle_t h = cudnn::handle(b.x.device());
  cudnn::TensorDesc x_desc, stats_desc;
  cudnn::set_image(x_desc, b.x, b.format, "batch_norm");
  PRECIS_CUDNN_CHECK(cudnnDeriveBNTensorDescriptor(stats_desc.get(), x_desc.get(), kMode), "batch_norm",
                     ": describing the statistics of ", describe(b.x));
  PRECIS_CUDNN_CHECK(cudnnBatchNormalizationBackward(h, kMode, cudnn::kOne.get(), cudnn::kZero.get(), cudnn::kOne.get(),
                                                     cudnn::kZero.get(), x_desc.get(), b.x.raw_data(), x_desc.get(),
                                                     b.gy.raw_data(), x_desc.get(), b.dx.raw_data(), stats_desc.get(),
                                                     b.weight.raw_data(), b.dw.raw_data(), b.db.raw_data(), b.eps,
                                                     b.save_mean.raw_data(), b.save_invstd.raw_data()),
                     "batch_norm", ": backward of ", describe(b.x));
}

Tensor relu_mask(const Tensor& gy, const Tensor& y) {
  // (dense in one memory format: the caller's dense_in; strides of size-1 dims may differ)
  PRECIS_CHECK(gy.shape() == y.shape() && gy.dtype() == y.dtype(), "batch_norm_relu: the gradient ", describe(gy),
               " does not match the output ", describe(y));
  Tensor out = empty({y.numel()}, y.dtype(), y.device()).as_strided(y.shape(), y.strides(), 0);
  const int64_t n = y.numel();
  if (n == 0) return out;
  dispatch_floating(y.dtype(), "batch_norm_relu", [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch(relu_mask_kernel<T>, grid_for(n), kBlockSize, 0, stream_for(out), data_of<T>(out), data_of<const T>(gy),
           data_of<const T>(y), n);
  });
  PRECIS_CUDA_CHECK_LAUNCH("batch_norm_relu backward");
  return out;
}

}  // namespace precis::ops::cuda
