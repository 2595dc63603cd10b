// Unscale and inf/NaN check in one pass (the loss scaler's per-step work).
//
//   found |= !isfinite(g[i]);  g[i] = g[i] * inv_scale          (computed in f32, f64 for f64)
//
// Bytes moved: read and write each gradient once (2 x 2 bytes per bf16 element,
// 2 x 4 per f32). The flag is one word in device memory, set by any thread that
// sees a non-finite value (a benign race: every writer writes 1).
//
// The device-resident scaler (GradScaler::keep_on_device) keeps scale, counters
// and the flag in one f64 array: the unscale reads the scale from it, and a
// one-thread kernel runs GradScaler::update's state machine on it, so a step
// never reads the scaler back to the host.
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

// inv_scale is the argument, or 1 / *scale when `scale` (on the device) is given.
template <typename T, typename C, typename Flag>
__global__ void unscale_kernel(T* g, int64_t n, C inv_scale, const double* scale, Flag* found) {
  precis::cuda::wait_for_previous_grid();
  precis::cuda::allow_next_grid_to_start();
  if (scale != nullptr) inv_scale = static_cast<C>(1.0 / *scale);
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    C x;
    if constexpr (std::is_same_v<T, double>) x = g[i];
    else x = to_float(g[i]);
    if (!isfinite(x)) *found = Flag(1);
    g[i] = static_cast<T>(x * inv_scale);
  }
}

template <typename T, typename C, typename Flag>
void launch(const Tensor& grad, C inv_scale, const double* scale, Flag* flag, cudaStream_t stream) {
  int64_t n = grad.numel();
  unsigned blocks = std::min<unsigned>(precis::cuda::grid_for(n), 132 * 8);
  precis::cuda::launch(unscale_kernel<T, C, Flag>, blocks, precis::cuda::kBlockSize, 0, stream,
                       static_cast<T*>(grad.raw_data()), n, inv_scale, scale, flag);
}

// Unscales `grad` by inv_scale (or 1 / *scale), raising *flag on inf/NaN, on the compute stream.
template <typename Flag>
void unscale(const Tensor& grad, double inv_scale, const double* scale, Flag* flag) {
  cudaStream_t stream = precis::cuda::compute_stream(grad.device());
  switch (grad.dtype()) {
    case DType::f32: launch<float, float>(grad, static_cast<float>(inv_scale), scale, flag, stream); break;
    case DType::f64: launch<double, double>(grad, inv_scale, scale, flag, stream); break;
    case DType::f16: launch<__half, float>(grad, static_cast<float>(inv_scale), scale, flag, stream); break;
    case DType::bf16: launch<__nv_bfloat16, float>(grad, static_cast<float>(inv_scale), scale, flag, stream); break;
    default: PRECIS_FAIL("GradScaler: gradients must be floating point, got ", describe(grad));
  }
  PRECIS_CUDA_CHECK_LAUNCH("GradScaler unscale");
}

// GradScaler::update (amp/grad_scaler.cpp) on the state array, the same f64 arithmetic.
struct UpdateRule {
  bool dynamic;
  double growth_factor, backoff_factor, min_scale, max_scale, growth_interval, hysteresis;
};

__global__ void update_kernel(double* s, float* scale_f32, UpdateRule rule) {
  precis::cuda::wait_for_previous_grid();
  precis::cuda::allow_next_grid_to_start();
  const bool found = s[kFoundInf] != 0;
  if (found) s[kSkippedSteps] += 1;
  if (rule.dynamic && found) {
    s[kGrowthTracker] = 0;
    s[kConsecutiveOverflows] += 1;
    if (s[kConsecutiveOverflows] >= rule.hysteresis) s[kScale] = fmax(s[kScale] * rule.backoff_factor, rule.min_scale);
  } else if (rule.dynamic) {
    s[kConsecutiveOverflows] = 0;
    s[kGrowthTracker] += 1;
    if (s[kGrowthTracker] == rule.growth_interval) {
      s[kScale] = fmin(s[kScale] * rule.growth_factor, rule.max_scale);
      s[kGrowthTracker] = 0;
    }
  }
  *scale_f32 = static_cast<float>(s[kScale]);
}

}  // namespace

bool unscale_and_check(const Tensor& grad, double inv_scale) {
  PRECIS_CHECK(grad.is_contiguous(), "GradScaler: GPU gradients must be dense, got ", describe(grad));
  if (grad.numel() == 0) return false;
  precis::cuda::DeviceGuard guard(grad.device());
  Tensor flag = zeros({1}, DType::i32, grad.device());
  unscale<int32_t>(grad, inv_scale, nullptr, flag.data<int32_t>());
  return flag.item<int32_t>() != 0;
}

void unscale_and_flag(const Tensor& grad, const Tensor& state) {
  PRECIS_CHECK(grad.is_contiguous(), "GradScaler: GPU gradients must be dense, got ", describe(grad));
  PRECIS_CHECK(state.is_cuda() && state.dtype() == DType::f64 && state.numel() == kScalerSlots &&
                   state.device() == grad.device(),
               "GradScaler: the device state must be f64 [", int64_t{kScalerSlots}, "] beside the gradients, got ",
               describe(state), " for ", describe(grad));
  if (grad.numel() == 0) return;
  precis::cuda::DeviceGuard guard(grad.device());
  double* s = state.data<double>();
  unscale<double>(grad, 1.0, s + kScale, s + kFoundInf);
}

void update_on_device(const Tensor& state, const Tensor& scale_f32, const GradScalerOptions& o) {
  precis::cuda::DeviceGuard guard(state.device());
  const UpdateRule rule{o.mode == ScalerMode::dynamic,
                        o.growth_factor,
                        o.backoff_factor,
                        o.min_scale,
                        o.max_scale,
                        static_cast<double>(o.growth_interval),
                        static_cast<double>(o.hysteresis)};
  precis::cuda::launch(update_kernel, 1, 1, 0, precis::cuda::compute_stream(state.device()), state.data<double>(),
                       scale_f32.data<float>(), rule);
  PRECIS_CUDA_CHECK_LAUNCH("GradScaler update");
}

}  // namespace precis::amp::cuda
