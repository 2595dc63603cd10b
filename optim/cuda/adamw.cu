// Fused AdamW on the GPU, in the manner of llm.c's adamw.cuh: one pass reads the
// parameter (or its f32 master copy), the gradient and both moments, and writes
// the moments and the parameter back. Per element, in the compute type C (f32,
// f64 for f64 parameters), exactly the CPU's formula (optim/adamw.cpp):
//   m <- b1 m + (1 - b1) g,   v <- b2 v + (1 - b2) g^2
//   x <- x (1 - lr wd) - (lr / bias1) m / (sqrt(v) / sqrt(bias2) + eps)
// x is the parameter, or for f16/bf16 parameters the f32 master copy when there is
// one (else the widened parameter); the parameter then gets x rounded to nearest
// even, or for bf16 stochastically.
// Bytes per element: param (or, when there is one, the master copy), grad, m, v
// read and param, m, v written, plus the master written (f32 parameters: 28 bytes;
// bf16 with a master copy: 28, as llm.c's kernel). A parameter with peer copies
// (ZeRO-1's fused gather) stores its new value into each of them too, over NVLink, and
// each thread of its blocks ends with a system-scope fence; the barrier queued after the
// step (ProcessGroup::peer_barrier) is what publishes them.
//
// The step reads its numbers from device memory instead of kernel arguments: a
// one-thread kernel advances the step count t (unless the loss scaler flagged the
// step to be skipped) and computes
//   step_size = lr / (1 - b1^t),  inv_sqrt_bias2 = 1 / sqrt(1 - b2^t)
// in f64 as the host does, and the update kernel reads them (and returns at once
// on a skipped step). The gradient factor c (clip_grad_norm's clip / scale) is
// applied to each gradient as it is read, g <- G(double(g) c), so no separate pass
// over the gradients.
#include <algorithm>
#include <map>
#include <tuple>

#include "core/cuda/launch.cuh"
#include "core/cuda/tensor_batch.cuh"
#include "optim/cuda/adamw.h"
#include "optim/cuda/step_kernels.cuh"
#include "optim/optimizer.h"

namespace precis::optim::cuda {

using precis::cuda::compute_t;
using precis::cuda::stream_for;
using precis::cuda::tensor_of_block;

namespace {

constexpr int kThreads = 256;
constexpr int64_t kChunk = int64_t{kThreads} * kVec * 8;  // elements per block

template <typename P, typename G, typename C>
struct AdamWSlot {
  P* param;
  const G* grad;
  C* m;
  C* v;
  float* master;  // f16/bf16 parameters with master weights, else null
  int64_t n;
  double weight_decay;
  uint32_t index;    // the parameter's index in the optimizer
  ComputeCopy copy;  // f32 parameters only
  bool vectorized;   // every array aligned for kVec-element accesses
  int8_t peers;      // its list of peer copies in the launch's AdamWPeerSets, or -1: none
};

template <typename P, typename G, typename C>
using AdamWBatch = precis::cuda::TensorBatch<AdamWSlot<P, G, C>, kAdamWBatch>;

// The lists of peer offsets of one launch (AdamWTensors::peer_offsets), which the slots name.
struct AdamWPeerSets {
  int count[kAdamWPeerSets];
  int64_t offset[kAdamWPeerSets][Optimizer::kMaxPeerCopies];
};

// `value`, just stored at `local`, into the same place of every peer copy of list `set`.
template <typename V>
__device__ __forceinline__ void store_peer_copies(const AdamWPeerSets& sets, int set, void* local, const V& value) {
  for (int r = 0; r < sets.count[set]; ++r)
    *reinterpret_cast<V*>(static_cast<char*>(local) + sets.offset[set][r]) = value;
}

template <typename C>
struct AdamWConstants {
  C step_size, inv_sqrt_bias2, b1, b2, eps;
  bool stochastic;
  uint64_t seed, step;
};

// Kernel arguments may total 32764 bytes: the batch, the constants, the peer lists and a pointer.
static_assert(sizeof(AdamWBatch<double, double, double>) + sizeof(AdamWConstants<double>) + sizeof(AdamWPeerSets) +
                      sizeof(void*) <=
                  32764,
              "AdamW batch too large for a kernel argument");

// The step's numbers (begin_device_step) and AdamW's bias corrections, computed on the device.
struct AdamWDeviceStep {
  DeviceStep base;
  double step_size, inv_sqrt_bias2;
};

// t <- t + 1 and the bias corrections, as optim/adamw.cpp computes them; nothing on a skipped step.
__global__ void adamw_prepare_kernel(DeviceStepInputs in, double beta1, double beta2, AdamWDeviceStep* out) {
  precis::cuda::wait_for_previous_grid();
  precis::cuda::allow_next_grid_to_start();
  begin_device_step(in, out->base);
  if (out->base.skip) return;
  const double t = static_cast<double>(out->base.step);
  const double bias1 = 1.0 - pow(beta1, t);
  const double bias2 = 1.0 - pow(beta2, t);
  out->step_size = out->base.lr / bias1;
  out->inv_sqrt_bias2 = 1.0 / sqrt(bias2);
}

// Products and sums each rounded on their own (the _rn intrinsics are never fused into a
// multiply-add), as the host computes them: otherwise the compiler may fuse differently in
// each instantiation, and a bf16 gradient would not step as its f32 widening does.
__device__ __forceinline__ float mul_rn(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double mul_rn(double a, double b) { return __dmul_rn(a, b); }
__device__ __forceinline__ float add_rn(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ double add_rn(double a, double b) { return __dadd_rn(a, b); }
__device__ __forceinline__ float sub_rn(float a, float b) { return __fsub_rn(a, b); }
__device__ __forceinline__ double sub_rn(double a, double b) { return __dsub_rn(a, b); }

//   m <- b1 m + (1 - b1) g;  v <- b2 v + (1 - b2) g^2
//   x <- x (1 - lr wd) - (lr / bias1) m / (sqrt(v) / sqrt(bias2) + eps)
template <typename C>
__device__ __forceinline__ C adamw_element(C x, C g, C& m, C& v, C decay, const AdamWConstants<C>& c) {
  m = add_rn(mul_rn(c.b1, m), mul_rn(sub_rn(C(1), c.b1), g));
  v = add_rn(mul_rn(c.b2, v), mul_rn(mul_rn(sub_rn(C(1), c.b2), g), g));
  const C denominator = add_rn(mul_rn(C(::sqrt(v)), c.inv_sqrt_bias2), c.eps);
  return sub_rn(mul_rn(x, decay), mul_rn(c.step_size, m) / denominator);
}

// Block b updates elements [chunk * kChunk, + kChunk) of its tensor, kVec at a time, with
// the step's numbers from `device` (the constants in `host` fill in the rest).
template <typename P, typename G, typename C>
__global__ void __launch_bounds__(kThreads)
    adamw_kernel(const __grid_constant__ AdamWBatch<P, G, C> batch, const AdamWConstants<C> host,
                 const __grid_constant__ AdamWPeerSets peers, const AdamWDeviceStep* device) {
  precis::cuda::wait_for_previous_grid();
  precis::cuda::allow_next_grid_to_start();
  if (device->base.skip) return;
  const int s = tensor_of_block(batch.first_block, batch.count, blockIdx.x);
  const AdamWSlot<P, G, C>& t = batch.slot[s];
  AdamWConstants<C> c = host;
  c.step_size = static_cast<C>(device->step_size);
  c.inv_sqrt_bias2 = static_cast<C>(device->inv_sqrt_bias2);
  c.step = device->base.step;
  const double factor = device->base.grad_factor;
  const bool in_f32 = device->base.grad_in_f32;
  const C decay =
      static_cast<C>(__dsub_rn(1.0, __dmul_rn(device->base.lr, t.weight_decay)));  // no fused multiply-add: as the host
  const int64_t start = (blockIdx.x - batch.first_block[s]) * kChunk;
  const int64_t end = start + kChunk < t.n ? start + kChunk : t.n;
  for (int64_t i = start + threadIdx.x * kVec; i < end; i += int64_t{kThreads} * kVec) {
    const bool stochastic = std::is_same_v<P, __nv_bfloat16> && c.stochastic;
    const Philox4 bits = stochastic ? rounding_bits(i / 4, t.index, c.step, c.seed) : Philox4{};
    if (t.vectorized && i + kVec <= end) {
      Vec<P> p;  // read only where it is x: with a master copy it is only written
      if (!t.master) p = *reinterpret_cast<const Vec<P>*>(t.param + i);
      const Vec<G> g = *reinterpret_cast<const Vec<G>*>(t.grad + i);
      Vec<C> m = *reinterpret_cast<const Vec<C>*>(t.m + i);
      Vec<C> v = *reinterpret_cast<const Vec<C>*>(t.v + i);
      Vec<float> master;
      if (t.master) master = *reinterpret_cast<const Vec<float>*>(t.master + i);
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        const C x = t.master ? C(master.v[k]) : convert_to<C>(p.v[k]);
        const C updated = adamw_element(x, scaled_gradient<C>(g.v[k], factor, in_f32), m.v[k], v.v[k], decay, c);
        if (t.master) master.v[k] = static_cast<float>(updated);
        p.v[k] = store_param<P>(updated, stochastic, bits.x[k]);
      }
      *reinterpret_cast<Vec<P>*>(t.param + i) = p;
      if (t.peers >= 0) store_peer_copies(peers, t.peers, t.param + i, p);
      if constexpr (std::is_same_v<P, float>) {
        if (t.copy.data != nullptr) store_copy(t.copy, i, p);
      }
      *reinterpret_cast<Vec<C>*>(t.m + i) = m;
      *reinterpret_cast<Vec<C>*>(t.v + i) = v;
      if (t.master) *reinterpret_cast<Vec<float>*>(t.master + i) = master;
    } else {
      for (int64_t j = i; j < i + kVec && j < end; ++j) {
        const C x = t.master ? C(t.master[j]) : convert_to<C>(t.param[j]);
        const C updated = adamw_element(x, scaled_gradient<C>(t.grad[j], factor, in_f32), t.m[j], t.v[j], decay, c);
        if (t.master) t.master[j] = static_cast<float>(updated);
        const P value = store_param<P>(updated, stochastic, bits.x[j % 4]);
        t.param[j] = value;
        if (t.peers >= 0) store_peer_copies(peers, t.peers, t.param + j, value);
        if constexpr (std::is_same_v<P, float>) {
          if (t.copy.data != nullptr) store_copy(t.copy, j, updated);
        }
      }
    }
  }
  if (t.peers >= 0) __threadfence_system();  // the peer stores before the barrier's release
}

// Updates `params` (one device; parameter type P, gradient type G) kAdamWBatch at a time,
// with the step's numbers at `device` (made by adamw_prepare_kernel).
template <typename P, typename G>
void adamw_launch(const std::vector<const AdamWTensors*>& params, const AdamWHyper& hyper,
                  const AdamWDeviceStep* device) {
  using C = compute_t<P>;
  const char* op = "AdamW";
  cudaStream_t stream = stream_for(params.front()->param);
  AdamWConstants<C> c{};  // step_size, inv_sqrt_bias2 and step come from `device`
  c.b1 = static_cast<C>(hyper.beta1);
  c.b2 = static_cast<C>(hyper.beta2);
  c.eps = static_cast<C>(hyper.eps);
  c.stochastic = hyper.stochastic_rounding;
  c.seed = hyper.seed;
  AdamWPeerSets peers{};
  int peer_sets = 0;
  // The list's index in `peers`, added if new; -1 for none.
  auto peer_set_of = [&](const std::vector<int64_t>& offsets) -> int8_t {
    if (offsets.empty()) return -1;
    for (int s = 0; s < peer_sets; ++s)
      if (static_cast<size_t>(peers.count[s]) == offsets.size() &&
          std::equal(offsets.begin(), offsets.end(), peers.offset[s]))
        return static_cast<int8_t>(s);
    PRECIS_CHECK(peer_sets < kAdamWPeerSets, op, ": more than ", kAdamWPeerSets, " lists of peer copies in one step");
    PRECIS_CHECK(offsets.size() <= Optimizer::kMaxPeerCopies, op, ": ", offsets.size(), " peer copies, more than ",
                 Optimizer::kMaxPeerCopies);
    for (int64_t o : offsets)
      PRECIS_CHECK(o % 16 == 0, op, ": a peer copy ", o, " bytes away breaks the 16-byte alignment of the stores");
    peers.count[peer_sets] = static_cast<int>(offsets.size());
    std::copy(offsets.begin(), offsets.end(), peers.offset[peer_sets]);
    return static_cast<int8_t>(peer_sets++);
  };
  for (size_t first = 0; first < params.size(); first += kAdamWBatch) {
    AdamWBatch<P, G, C> batch{};
    batch.count = static_cast<int>(std::min<size_t>(kAdamWBatch, params.size() - first));
    for (int s = 0; s < batch.count; ++s) {
      const AdamWTensors& a = *params[first + s];
      AdamWSlot<P, G, C>& slot = batch.slot[s];
      slot.param = static_cast<P*>(a.param.raw_data());
      slot.grad = static_cast<const G*>(a.grad.raw_data());
      slot.m = static_cast<C*>(a.exp_avg.raw_data());
      slot.v = static_cast<C*>(a.exp_avg_sq.raw_data());
      slot.master = a.master.defined() ? static_cast<float*>(a.master.raw_data()) : nullptr;
      slot.n = a.param.numel();
      slot.weight_decay = a.weight_decay;
      slot.index = static_cast<uint32_t>(a.index);
      slot.copy = compute_copy_of(a.compute_copy);
      slot.peers = peer_set_of(a.peer_offsets);
      slot.vectorized = vec_aligned<P>(slot.param) && vec_aligned<G>(slot.grad) && vec_aligned<C>(slot.m) &&
                        vec_aligned<C>(slot.v) && (!slot.master || vec_aligned<float>(slot.master)) &&
                        (!slot.copy.data || vec_aligned<__half>(slot.copy.data));
      batch.first_block[s + 1] = batch.first_block[s] + (slot.n + kChunk - 1) / kChunk;
    }
    const int64_t blocks = batch.first_block[batch.count];
    if (blocks == 0) continue;
    PRECIS_CHECK(blocks <= INT32_MAX, op, ": ", blocks, " blocks in one launch");
    precis::cuda::launch(adamw_kernel<P, G, C>, static_cast<unsigned>(blocks), kThreads, 0, stream, batch, c, peers,
                         device);
    PRECIS_CUDA_CHECK_LAUNCH(op);
  }
}

// One launch sequence per (device, parameter dtype, gradient dtype), in parameter order.
void launch_all(const std::vector<AdamWTensors>& params, const AdamWHyper& step, const AdamWDeviceStep* device_step) {
  std::map<std::tuple<int, DType, DType>, std::vector<const AdamWTensors*>> groups;
  for (const AdamWTensors& a : params) groups[{a.param.device().index, a.param.dtype(), a.grad.dtype()}].push_back(&a);
  for (const auto& [key, group] : groups) {
    const auto [device, param, grad] = key;
    if (param == DType::f32 && grad == DType::f32)
      adamw_launch<float, float>(group, step, device_step);
    else if (param == DType::f64 && grad == DType::f64)
      adamw_launch<double, double>(group, step, device_step);
    else if (param == DType::f32 && grad == DType::bf16)
      adamw_launch<float, __nv_bfloat16>(group, step, device_step);
    else if (param == DType::f32 && grad == DType::f16)
      adamw_launch<float, __half>(group, step, device_step);
    else if (param == DType::f16 && grad == DType::f32)
      adamw_launch<__half, float>(group, step, device_step);
    else if (param == DType::f16 && grad == DType::f16)
      adamw_launch<__half, __half>(group, step, device_step);
    else if (param == DType::f16 && grad == DType::bf16)
      adamw_launch<__half, __nv_bfloat16>(group, step, device_step);
    else if (param == DType::bf16 && grad == DType::f32)
      adamw_launch<__nv_bfloat16, float>(group, step, device_step);
    else if (param == DType::bf16 && grad == DType::bf16)
      adamw_launch<__nv_bfloat16, __nv_bfloat16>(group, step, device_step);
    else if (param == DType::bf16 && grad == DType::f16)
      adamw_launch<__nv_bfloat16, __half>(group, step, device_step);
    else
      PRECIS_FAIL("AdamW: no CUDA kernel for ", param, " parameters with ", grad, " gradients");
  }
}

}  // namespace

void adamw_step(const std::vector<AdamWTensors>& params, const AdamWHyper& hyper, const DeviceStepInputs& inputs) {
  const char* op = "AdamW";
  if (params.empty()) return;
  PRECIS_CHECK(inputs.lr != nullptr && inputs.step != nullptr, op, ": the step needs lr and step on the device");
  const Device device = params.front().param.device();
  for (const AdamWTensors& a : params)
    PRECIS_CHECK(a.param.device() == device, op, ": one step updates parameters of one GPU, got ", device, " and ",
                 a.param.device());
  // The step's numbers: made on the device, read by every launch, freed once they are queued
  // (a later request on the compute stream runs after them).
  Tensor numbers = empty({static_cast<int64_t>((sizeof(AdamWDeviceStep) + 7) / 8)}, DType::f64, device);
  AdamWDeviceStep* device_step = static_cast<AdamWDeviceStep*>(numbers.raw_data());
  precis::cuda::launch(adamw_prepare_kernel, 1, 1, 0, stream_for(params.front().param), inputs, hyper.beta1,
                       hyper.beta2, device_step);
  PRECIS_CUDA_CHECK_LAUNCH(op);
  launch_all(params, hyper, device_step);
}

}  // namespace precis::optim::cuda
