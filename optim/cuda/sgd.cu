// SGD on the GPU: optim/sgd_rule.h's update per element, in the compute type C (f32,
// f64 for f64 parameters), as the CPU loop computes it. x is the parameter, or for
// f16/bf16 parameters the f32 master copy when there is one (else the widened
// parameter); the parameter then gets x rounded to nearest even, or for bf16
// stochastically. A one-thread kernel first reads the step's numbers (learning rate,
// step count advanced unless skipped, gradient factor) from device memory, so nothing
// is baked into a launch and a CUDA graph can replay them. The parameters are batched as
// AdamW's (core/cuda/tensor_batch.cuh): one launch updates up to kBatch tensors, so a ResNet's
// ~60-160 small tensors take one launch instead of one each.
// Bytes per element: param, grad and buffer read, param and buffer written (plus the
// master read and written when there is one): 20 for f32 parameters with momentum, so
// ResNet-18's 11.2M parameters move 223 MB a step. Each thread takes kVec elements at a
// time (step_kernels.cuh), one access per array where every array is aligned for it, as
// AdamW's kernel does: scalar loads keep too few bytes in flight to reach the bandwidth.
#include <algorithm>
#include <map>
#include <utility>

#include "core/cuda/launch.cuh"
#include "core/cuda/runtime.h"
#include "core/cuda/tensor_batch.cuh"
#include "optim/cuda/sgd.h"
#include "optim/cuda/step_kernels.cuh"

namespace precis::optim::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kBatch = 256;                               // tensors a launch
constexpr int64_t kChunk = int64_t{kThreads} * kVec * 8;  // elements a block

__global__ void sgd_prepare_kernel(DeviceStepInputs in, DeviceStep* out) {
  precis::cuda::wait_for_previous_grid();
  precis::cuda::allow_next_grid_to_start();
  begin_device_step(in, *out);
}

template <typename P, typename G, typename C>
struct SGDSlot {
  P* param;
  const G* grad;
  C* buf;         // the momentum buffer, or null
  float* master;  // f16/bf16 parameters with master weights, else null
  int64_t n;
  double weight_decay;
  uint32_t index;    // the parameter's index in the optimizer
  ComputeCopy copy;  // f32 parameters only
  bool vectorized;   // every array aligned for kVec-element accesses
};

template <typename P, typename G, typename C>
using SGDBatch = precis::cuda::TensorBatch<SGDSlot<P, G, C>, kBatch>;
// Kernel arguments may total 32764 bytes (the rule, the seed and a pointer travel beside the batch).
static_assert(sizeof(SGDBatch<double, double, double>) <= 32764 - 256, "SGD batch too large for a kernel argument");

// Block b updates elements [chunk * kChunk, + kChunk) of its tensor.
template <typename P, typename G, typename C>
__global__ void __launch_bounds__(kThreads)
    sgd_kernel(const __grid_constant__ SGDBatch<P, G, C> batch, SGDRule rule, bool stochastic_rounding, uint64_t seed,
               const DeviceStep* step) {
  precis::cuda::wait_for_previous_grid();
  precis::cuda::allow_next_grid_to_start();
  if (step->skip) return;
  const int s = precis::cuda::tensor_of_block(batch.first_block, batch.count, blockIdx.x);
  const SGDSlot<P, G, C>& t = batch.slot[s];
  const bool first = step->step == 1;
  const bool stochastic = std::is_same_v<P, __nv_bfloat16> && stochastic_rounding;
  const int64_t start = (blockIdx.x - batch.first_block[s]) * kChunk;
  const int64_t end = start + kChunk < t.n ? start + kChunk : t.n;
  const double lr = step->lr, factor = step->grad_factor;
  const bool in_f32 = step->grad_in_f32;
  for (int64_t i = start + threadIdx.x * kVec; i < end; i += int64_t{kThreads} * kVec) {
    const Philox4 bits = stochastic ? rounding_bits(i / 4, t.index, step->step, seed) : Philox4{};
    if (t.vectorized && i + kVec <= end) {
      Vec<P> p;  // read only where it is x: with a master copy it is only written
      if (t.master == nullptr) p = *reinterpret_cast<const Vec<P>*>(t.param + i);
      const Vec<G> g = *reinterpret_cast<const Vec<G>*>(t.grad + i);
      Vec<C> buf;
      if (t.buf != nullptr) buf = *reinterpret_cast<const Vec<C>*>(t.buf + i);
      Vec<float> master;
      if (t.master != nullptr) master = *reinterpret_cast<const Vec<float>*>(t.master + i);
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        const C x = t.master != nullptr ? C(master.v[k]) : convert_to<C>(p.v[k]);
        const C updated = sgd_element<C>(x, scaled_gradient<C>(g.v[k], factor, in_f32),
                                         t.buf != nullptr ? &buf.v[k] : nullptr, lr, t.weight_decay, rule, first);
        if (t.master != nullptr) master.v[k] = static_cast<float>(updated);
        p.v[k] = store_param<P>(updated, stochastic, bits.x[k]);
      }
      *reinterpret_cast<Vec<P>*>(t.param + i) = p;
      if constexpr (std::is_same_v<P, float>) {
        if (t.copy.data != nullptr) store_copy(t.copy, i, p);
      }
      if (t.buf != nullptr) *reinterpret_cast<Vec<C>*>(t.buf + i) = buf;
      if (t.master != nullptr) *reinterpret_cast<Vec<float>*>(t.master + i) = master;
    } else {
      for (int64_t j = i; j < i + kVec && j < end; ++j) {
        const C x = t.master != nullptr ? C(t.master[j]) : convert_to<C>(t.param[j]);
        const C updated = sgd_element<C>(x, scaled_gradient<C>(t.grad[j], factor, in_f32),
                                         t.buf != nullptr ? t.buf + j : nullptr, lr, t.weight_decay, rule, first);
        if (t.master != nullptr) t.master[j] = static_cast<float>(updated);
        t.param[j] = store_param<P>(updated, stochastic, bits.x[j % 4]);
        if constexpr (std::is_same_v<P, float>) {
          if (t.copy.data != nullptr) store_copy(t.copy, j, updated);
        }
      }
    }
  }
}

// Updates `params` (parameter type P, gradient type G) kBatch tensors a launch.
template <typename P, typename G>
void sgd_launch(const std::vector<const SGDTensors*>& params, const SGDHyper& hyper, const DeviceStep* step,
                cudaStream_t stream) {
  using C = precis::cuda::compute_t<P>;
  for (size_t first = 0; first < params.size(); first += kBatch) {
    SGDBatch<P, G, C> batch{};
    batch.count = static_cast<int>(std::min<size_t>(kBatch, params.size() - first));
    for (int s = 0; s < batch.count; ++s) {
      const SGDTensors& t = *params[first + s];
      SGDSlot<P, G, C>& slot = batch.slot[s];
      slot.param = static_cast<P*>(t.param.raw_data());
      slot.grad = static_cast<const G*>(t.grad.raw_data());
      slot.buf = t.momentum_buffer.defined() ? static_cast<C*>(t.momentum_buffer.raw_data()) : nullptr;
      slot.master = t.master.defined() ? static_cast<float*>(t.master.raw_data()) : nullptr;
      slot.n = t.param.numel();
      slot.weight_decay = t.weight_decay;
      slot.index = static_cast<uint32_t>(t.index);
      slot.copy = compute_copy_of(t.compute_copy);
      slot.vectorized = vec_aligned<P>(slot.param) && vec_aligned<G>(slot.grad) &&
                        (!slot.buf || vec_aligned<C>(slot.buf)) && (!slot.master || vec_aligned<float>(slot.master)) &&
                        (!slot.copy.data || vec_aligned<__half>(slot.copy.data));
      batch.first_block[s + 1] = batch.first_block[s] + (t.param.numel() + kChunk - 1) / kChunk;
    }
    const int64_t blocks = batch.first_block[batch.count];
    if (blocks == 0) continue;
    PRECIS_CHECK(blocks <= INT32_MAX, "SGD: ", blocks, " blocks in one launch");
    precis::cuda::launch(sgd_kernel<P, G, C>, static_cast<unsigned>(blocks), kThreads, 0, stream, batch, hyper.rule,
                         hyper.stochastic_rounding, hyper.seed, step);
    PRECIS_CUDA_CHECK_LAUNCH("SGD");
  }
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
  // One launch sequence per (parameter dtype, gradient dtype), in parameter order.
  std::map<std::pair<DType, DType>, std::vector<const SGDTensors*>> groups;
  for (const SGDTensors& t : params) {
    PRECIS_CHECK(t.param.device() == device, op, ": one step updates parameters of one GPU, got ", device, " and ",
                 t.param.device());
    groups[{t.param.dtype(), t.grad.dtype()}].push_back(&t);
  }
  for (const auto& [dtypes, group] : groups) {
    const auto [p, g] = dtypes;
    if (p == DType::f32 && g == DType::f32)
      sgd_launch<float, float>(group, hyper, step, stream);
    else if (p == DType::f64 && g == DType::f64)
      sgd_launch<double, double>(group, hyper, step, stream);
    else if (p == DType::f32 && g == DType::bf16)
      sgd_launch<float, __nv_bfloat16>(group, hyper, step, stream);
    else if (p == DType::f32 && g == DType::f16)
      sgd_launch<float, __half>(group, hyper, step, stream);
    else if (p == DType::f16 && g == DType::f32)
      sgd_launch<__half, float>(group, hyper, step, stream);
    else if (p == DType::f16 && g == DType::f16)
      sgd_launch<__half, __half>(group, hyper, step, stream);
    else if (p == DType::f16 && g == DType::bf16)
      sgd_launch<__half, __nv_bfloat16>(group, hyper, step, stream);
    else if (p == DType::bf16 && g == DType::f32)
      sgd_launch<__nv_bfloat16, float>(group, hyper, step, stream);
    else if (p == DType::bf16 && g == DType::bf16)
      sgd_launch<__nv_bfloat16, __nv_bfloat16>(group, hyper, step, stream);
    else if (p == DType::bf16 && g == DType::f16)
      sgd_launch<__nv_bfloat16, __half>(group, hyper, step, stream);
    else
      PRECIS_FAIL(op, ": no CUDA kernel for ", p, " parameters with ", g, " gradients");
  }
}

}  // namespace precis::optim::cuda
