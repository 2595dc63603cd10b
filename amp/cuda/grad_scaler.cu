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
#include "amp/cuda/grad_scaler.h"
#include "core/allocator.h"
#include "core/cuda/convert.cuh"
#include "core/cuda/dispatch.cuh"
#include "core/cuda/launch.cuh"
#include "core/cuda/runtime.h"

namespace precis::amp::cuda {

namespace {

// inv_scale = 1 / *scale, in the compute type C (f32 for f16/bf16 gradients).
template <typename T, typename C = precis::cuda::compute_t<T>>
__global__ void unscale_kernel(T* g, int64_t n, const double* scale, double* found) {
  precis::cuda::wait_for_previous_grid();
  precis::cuda::allow_next_grid_to_start();
  const C inv_scale = static_cast<C>(1.0 / *scale);
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const C x = precis::cuda::convert_to<C>(g[i]);
    if (!isfinite(x)) *found = 1;
    g[i] = precis::cuda::convert_to<T>(x * inv_scale);
  }
}

template <typename T>
void launch(const Tensor& grad, double* state, cudaStream_t stream) {
  int64_t n = grad.numel();
  unsigned blocks = std::min<unsigned>(precis::cuda::grid_for(n), 132 * 8);
  precis::cuda::launch(unscale_kernel<T>, blocks, precis::cuda::kBlockSize, 0, stream, static_cast<T*>(grad.raw_data()),
                       n, state + kScale, state + kFoundInf);
}

__global__ void update_kernel(double* s, float* scale_f32, ScalerRule rule) {
  precis::cuda::wait_for_previous_grid();
  precis::cuda::allow_next_grid_to_start();
  advance_scaler_state(s, rule);
  *scale_f32 = static_cast<float>(s[kScale]);
}

}  // namespace

void unscale_(const Tensor& grad, const Tensor& state) {
  PRECIS_CHECK(is_non_overlapping_and_dense(grad), "GradScaler: GPU gradients must be dense, got ", describe(grad));
  PRECIS_CHECK(state.is_cuda() && state.dtype() == DType::f64 && state.numel() == kScalerSlots &&
                   state.device() == grad.device(),
               "GradScaler: the state must be f64 [", int64_t{kScalerSlots}, "] beside the gradients, got ",
               describe(state), " for ", describe(grad));
  if (grad.numel() == 0) return;
  precis::cuda::DeviceGuard guard(grad.device());
  cudaStream_t stream = precis::cuda::compute_stream(grad.device());
  double* s = state.data<double>();
  precis::cuda::dispatch_floating(grad.dtype(), "GradScaler: gradients",
                                  [&](auto tag) { launch<typename decltype(tag)::type>(grad, s, stream); });
  PRECIS_CUDA_CHECK_LAUNCH("GradScaler unscale");
}

void update_(const Tensor& state, const Tensor& scale_f32, const ScalerRule& rule) {
  precis::cuda::DeviceGuard guard(state.device());
  precis::cuda::launch(update_kernel, 1, 1, 0, precis::cuda::compute_stream(state.device()), state.data<double>(),
                       scale_f32.data<float>(), rule);
  PRECIS_CUDA_CHECK_LAUNCH("GradScaler update");
}

}  // namespace precis::amp::cuda
