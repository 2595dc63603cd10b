// Unscale and inf/NaN check in one pass (the loss scaler's per-step work).
//
//   found |= !isfinite(g[i]);  g[i] = g[i] * inv_scale          (computed in f32, f64 for f64)
//
// Bytes moved: read and write each gradient once (2 x 2 bytes per bf16 element,
// 2 x 4 per f32). The flag is one int in device memory, set by any thread that
// sees a non-finite value (a benign race: every writer writes 1).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "amp/cuda/grad_scaler.h"
#include "core/allocator.h"
#include "core/cuda/runtime.h"

namespace precis::amp::cuda {

namespace {

template <typename T>
__device__ inline float to_float(T x) {
  return static_cast<float>(x);
}
template <>
__device__ inline float to_float(__half x) {
  return __half2float(x);
}
template <>
__device__ inline float to_float(__nv_bfloat16 x) {
  return __bfloat162float(x);
}

template <typename T, typename C>
__global__ void unscale_kernel(T* g, int64_t n, C inv_scale, int* found) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    C x;
    if constexpr (std::is_same_v<T, double>) x = g[i];
    else x = to_float(g[i]);
    if (!isfinite(x)) *found = 1;
    g[i] = static_cast<T>(x * inv_scale);
  }
}

template <typename T, typename C>
void launch(const Tensor& grad, C inv_scale, int* flag, cudaStream_t stream) {
  int64_t n = grad.numel();
  unsigned blocks = std::min<unsigned>(precis::cuda::grid_for(n), 132 * 8);
  unscale_kernel<T, C><<<blocks, precis::cuda::kBlockSize, 0, stream>>>(static_cast<T*>(grad.raw_data()), n,
                                                                       inv_scale, flag);
}

}  // namespace

bool unscale_and_check(const Tensor& grad, double inv_scale) {
  PRECIS_CHECK(grad.is_contiguous(), "GradScaler: GPU gradients must be dense, got ", describe(grad));
  if (grad.numel() == 0) return false;
  precis::cuda::DeviceGuard guard(grad.device());
  cudaStream_t stream = precis::cuda::compute_stream(grad.device());
  Tensor flag = zeros({1}, DType::i32, grad.device());
  int* f = flag.data<int32_t>();
  switch (grad.dtype()) {
    case DType::f32: launch<float, float>(grad, static_cast<float>(inv_scale), f, stream); break;
    case DType::f64: launch<double, double>(grad, inv_scale, f, stream); break;
    case DType::f16: launch<__half, float>(grad, static_cast<float>(inv_scale), f, stream); break;
    case DType::bf16: launch<__nv_bfloat16, float>(grad, static_cast<float>(inv_scale), f, stream); break;
    default: PRECIS_FAIL("GradScaler: gradients must be floating point, got ", describe(grad));
  }
  PRECIS_CUDA_CHECK_LAUNCH("GradScaler unscale");
  return flag.item<int32_t>() != 0;
}

}  // namespace precis::amp::cuda
