// SGD on the GPU: optim/sgd_rule.h's update per element, in the compute type C (f32,
// f64 for f64 parameters), as the CPU loop computes it. x is the parameter, or for
// f16/bf16 parameters the f32 master copy when there is one (else the widened
// parameter); the parameter then gets x rounded to nearest even, or for bf16
// stochastically. A one-thread kernel first reads the step's numbers (learning rate,
// step count advanced unless skipped, gradient factor) from device memory, so nothing
// is baked into a launch and a CUDA graph can replay them.
// Bytes per element: param, grad and buffer read, param and buffer written (plus the
// master read and written when there is one).
#include <algorithm>

#include "core/cuda/launch.cuh"
#include "core/cuda/runtime.h"
#include "optim/cuda/sgd.h"
#include "optim/cuda/step_kernels.cuh"

namespace precis::optim::cuda {

namespace {

constexpr int kThreads = 256;

__global__ void sgd_prepare_kernel(DeviceStepInputs in, DeviceStep* out) {
  precis::cuda::wait_for_previous_grid();
  precis::cuda::allow_next_grid_to_start();
  begin_device_step(in, *out);
}

template <typename P, typename G, typename C>
__global__ void __launch_bounds__(kThreads)
    sgd_kernel(P* param, const G* grad, C* buf, float* master, int64_t n, double weight_decay, uint32_t index,
               SGDRule rule, bool stochastic_rounding, uint64_t seed, const DeviceStep* step) {
  precis::cuda::wait_for_previous_grid();
  precis::cuda::allow_next_grid_to_start();
  if (step->skip) return;
  const bool first = step->step == 1;
  const bool stochastic = std::is_same_v<P, __nv_bfloat16> && stochastic_rounding;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const C x = master != nullptr ? C(master[i]) : convert_to<C>(param[i]);
    const C updated = sgd_element<C>(x, scaled_gradient<C>(grad[i], step->grad_factor),
                                     buf != nullptr ? buf + i : nullptr, step->lr, weight_decay, rule, first);
    if (master != nullptr) master[i] = static_cast<float>(updated);
    const uint32_t word = stochastic ? rounding_bits(i / 4, index, step->step, seed).x[i % 4] : 0u;
    param[i] = store_param<P>(updated, stochastic, word);
  }
}

template <typename P, typename G>
void sgd_launch(const SGDTensors& t, const SGDHyper& hyper, const DeviceStep* step, cudaStream_t stream) {
  using C = precis::cuda::compute_t<P>;
  const int64_t n = t.param.numel();
  if (n == 0) return;
  const unsigned blocks = std::min<unsigned>(precis::cuda::grid_for(n), 132 * 8);
  precis::cuda::launch(sgd_kernel<P, G, C>, blocks, kThreads, 0, stream, static_cast<P*>(t.param.raw_data()),
                       static_cast<const G*>(t.grad.raw_data()),
                       t.momentum_buffer.defined() ? static_cast<C*>(t.momentum_buffer.raw_data()) : nullptr,
                       t.master.defined() ? static_cast<float*>(t.master.raw_data()) : nullptr, n, t.weight_decay,
                       static_cast<uint32_t>(t.index), hyper.rule, hyper.stochastic_rounding, hyper.seed, step);
  PRECIS_CUDA_CHECK_LAUNCH("SGD");
}

}  // namespace

void sgd_step(const std::vector<SGDTensors>& params, const SGDHyper& hyper, const DeviceStepInputs& inputs) {
  const char* op = "SGD";
  if (params.empty()) return;
  PRECIS_CHECK(inputs.lr != nullptr && inputs.step != nullptr, op, ": the step needs lr and step on the device");
  const Device device = params.front().param.device();
  precis::cuda::DeviceGuard guard(device);
  cudaStream_t stream = precis::cuda::stream_for(params.front().param);
  // The step's numbers: made on the device, read by every launch, freed once they are queued
  // (a later request on the compute stream runs after them).
  Tensor numbers = empty({static_cast<int64_t>((sizeof(DeviceStep) + 7) / 8)}, DType::f64, device);
  DeviceStep* step = static_cast<DeviceStep*>(numbers.raw_data());
  precis::cuda::launch(sgd_prepare_kernel, 1, 1, 0, stream, inputs, step);
  PRECIS_CUDA_CHECK_LAUNCH(op);
  for (const SGDTensors& t : params) {
    PRECIS_CHECK(t.param.device() == device, op, ": one step updates parameters of one GPU, got ", device, " and ",
                 t.param.device());
    const DType p = t.param.dtype(), g = t.grad.dtype();
    if (p == DType::f32 && g == DType::f32)
      sgd_launch<float, float>(t, hyper, step, stream);
    else if (p == DType::f64 && g == DType::f64)
      sgd_launch<double, double>(t, hyper, step, stream);
    else if (p == DType::f16 && g == DType::f32)
      sgd_launch<__half, float>(t, hyper, step, stream);
    else if (p == DType::f16 && g == DType::f16)
      sgd_launch<__half, __half>(t, hyper, step, stream);
    else if (p == DType::bf16 && g == DType::f32)
      sgd_launch<__nv_bfloat16, float>(t, hyper, step, stream);
    else if (p == DType::bf16 && g == DType::bf16)
      sgd_launch<__nv_bfloat16, __nv_bfloat16>(t, hyper, step, stream);
    else
      PRECIS_FAIL(op, ": no CUDA kernel for ", p, " parameters with ", g, " gradients");
  }
}

}  // namespace precis::optim::cuda
