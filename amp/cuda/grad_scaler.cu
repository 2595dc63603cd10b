// Unscale and inf/NaN check in one pass (the loss scaler's per-step work).
//
//   found |= !isfinite(g[i]);  g[i] = g[i] * inv_scale          (computed in f32, f64 for f64)
//
// Bytes moved: read and write each gradient once (2 x 2 bytes per bf16 element,
// 2 x 4 per f32). The flag is one word in device memory, set by any thread that
// sees a non-finite value (a benign race: every writer writes 1).
//
// The scaler keeps scale, counters and the flag in one f64 array on the device
// (amp/scaler_state.h): the unscale reads the scale from it, and a one-thread
// kernel runs the state machine (advance_scaler_state, shared with the CPU) on
// it, so a step never reads the scaler back to the host.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "amp/cuda/grad_scaler.h"
#include "core/allocator.h"
#include "core/cuda/launch.cuh"
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

// inv_scale = 1 / *scale, in the compute type C.
template <typename T, typename C>
__global__ void unscale_kernel(T* g, int64_t n, const double* scale, double* found) {
  precis::cuda::wait_for_previous_grid();
  precis::cuda::allow_next_grid_to_start();
  const C inv_scale = static_cast<C>(1.0 / *scale);
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    C x;
    if constexpr (std::is_same_v<T, double>)
      x = g[i];
    else
      x = to_float(g[i]);
    if (!isfinite(x)) *found = 1;
    g[i] = static_cast<T>(x * inv_scale);
  }
}

template <typename T, typename C>
void launch(const Tensor& grad, double* state, cudaStream_t stream) {
  int64_t n = grad.numel();
  unsigned blocks = std::min<unsigned>(precis::cuda::grid_for(n), 132 * 8);
  precis::cuda::launch(unscale_kernel<T, C>, blocks, precis::cuda::kBlockSize, 0, stream,
                       static_cast<T*>(grad.raw_data()), n, state + kScale, state + kFoundInf);
}

__global__ void update_kernel(double* s, float* scale_f32, ScalerRule rule) {
  precis::cuda::wait_for_previous_grid();
  precis::cuda::allow_next_grid_to_start();
  advance_scaler_state(s, rule);
  *scale_f32 = static_cast<float>(s[kScale]);
}

}  // namespace

void unscale_(const Tensor& grad, const Tensor& state) {
  PRECIS_CHECK(grad.is_contiguous(), "GradScaler: GPU gradients must be dense, got ", describe(grad));
  PRECIS_CHECK(state.is_cuda() && state.dtype() == DType::f64 && state.numel() == kScalerSlots &&
                   state.device() == grad.device(),
               "GradScaler: the state must be f64 [", int64_t{kScalerSlots}, "] beside the gradients, got ",
               describe(state), " for ", describe(grad));
  if (grad.numel() == 0) return;
  precis::cuda::DeviceGuard guard(grad.device());
  cudaStream_t stream = precis::cuda::compute_stream(grad.device());
  double* s = state.data<double>();
  switch (grad.dtype()) {
    case DType::f32:
      launch<float, float>(grad, s, stream);
      break;
    case DType::f64:
      launch<double, double>(grad, s, stream);
      break;
    case DType::f16:
      launch<__half, float>(grad, s, stream);
      break;
    case DType::bf16:
      launch<__nv_bfloat16, float>(grad, s, stream);
      break;
    default:
      PRECIS_FAIL("GradScaler: gradients must be floating point, got ", describe(grad));
  }
  PRECIS_CUDA_CHECK_LAUNCH("GradScaler unscale");
}

void update_(const Tensor& state, const Tensor& scale_f32, const ScalerRule& rule) {
  precis::cuda::DeviceGuard guard(state.device());
  precis::cuda::launch(update_kernel, 1, 1, 0, precis::cuda::compute_stream(state.device()), state.data<double>(),
                       scale_f32.data<float>(), rule);
  PRECIS_CUDA_CHECK_LAUNCH("GradScaler update");
}

}  // namespace precis::amp::cuda
