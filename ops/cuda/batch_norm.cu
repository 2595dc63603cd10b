// batch_norm on the GPU (ops/cuda/batch_norm.h): the math of ops/batch_norm.cpp in three
// kernels each way, over x seen as [N, C, S] with M = N S values per channel.
//
//   channel_sums   two sums per channel, f32, of values the caller's functor makes of each
//                  element: a grid of (channel tiles) x G blocks, each block summing a
//                  slice of every one of its channels' M values into its own [G, 2, C]
//                  partial (no atomics: the same order every run);
//   finalize       one thread per channel adds its G partials in order and derives the
//                  per-channel coefficients;
//   apply          one thread per element: y = (x - mean) scale + bias (then max(0, .)), or dx.
//                  (Not x scale + (bias - mean scale): with |mean| >> std its two large
//                  terms cancel and the output loses the f32 digits the CPU keeps.)
//
// Forward sums (x - p) and (x - p)^2, p = the channel's first value (a "shifted" variance:
// p lies in the data, so the difference E[(x-p)^2] - E[x-p]^2 does not cancel as
// E[x^2] - E[x]^2 would when |mean| >> std): mean = p + s1 / M, var = s2 / M - (s1 / M)^2,
// and the running statistics r <- (1 - momentum) r + momentum (mean, var M / (M - 1)).
// Eval skips the sums: mean, var are the running ones.
// Backward sums g' and g' (x - mean), g' = g, or g [y > 0] for batch_norm_relu:
//   db = sum g',  dw = invstd sum g' (x - mean),  k = w invstd, and
//   training: dx = k g' - k db / M - (x - mean) k invstd dw / M;   eval: dx = k g'.
//
// Layouts: NCHW puts a channel's values in N runs of S; a block of 256 threads takes one
// channel, consecutive threads consecutive values. Channels-last puts the C channels of a
// cell side by side; a block takes 32 channels, its 8 warps' lanes reading 32 neighbours.
#include <algorithm>
#include <tuple>

#include "core/copy.h"
#include "core/cuda/block_reduce.cuh"
#include "core/cuda/convert.cuh"
#include "core/cuda/dispatch.cuh"
#include "core/cuda/launch.cuh"
#include "ops/cuda/batch_norm.h"

namespace precis::ops::cuda {

using namespace precis::cuda;  // the device toolkit (core/cuda/)

namespace {

constexpr int kThreads = 256;
constexpr int kLanes = 32;  // channels per block, channels-last

// Where a channel's values lie in memory.
struct Layout {
  int64_t C, S, M;
  bool channels_last;
  // the memory position of value j (0 <= j < M) of channel c
  __device__ int64_t at(int64_t j, int64_t c) const { return channels_last ? j * C + c : (j / S * C + c) * S + j % S; }
  // the channel of the element at memory position i
  __device__ int64_t channel(int64_t i) const { return channels_last ? i % C : (i / S) % C; }
};

// The statistics sums: x - p and (x - p)^2, p the channel's first value.
template <typename T>
struct ForwardValues {
  const T* x;
  __device__ Pair<float> operator()(int64_t i, int64_t c, const Layout& l) const {
    const float d = convert_to<float>(x[i]) - convert_to<float>(x[l.at(0, c)]);
    return {d, d * d};
  }
};

// The gradient sums: g' and g' (x - mean).
template <typename T>
struct BackwardValues {
  const T* x;
  const T* y;  // the relu's output, or null
  const T* gy;
  const float* mean;
  __device__ Pair<float> operator()(int64_t i, int64_t c, const Layout&) const {
    const float g = (y && !(convert_to<float>(y[i]) > 0.f)) ? 0.f : convert_to<float>(gy[i]);
    return {g, g * (convert_to<float>(x[i]) - mean[c])};
  }
};

// partial[(g * 2 + k) * C + c] = sum over block row g's slice of channel c of values(...)[k].
template <typename Values>
__global__ void channel_sums_kernel(Values values, Layout l, float* partial) {
  wait_for_previous_grid();
  allow_next_grid_to_start();
  const int64_t G = gridDim.y, g = blockIdx.y;
  Pair<float> acc{0.f, 0.f};
  if (l.channels_last) {
    __shared__ Pair<float> rows[kThreads / kLanes][kLanes];
    const int lane = threadIdx.x % kLanes, row = threadIdx.x / kLanes;
    const int64_t c = static_cast<int64_t>(blockIdx.x) * kLanes + lane;
    if (c < l.C)
      for (int64_t j = g * (kThreads / kLanes) + row; j < l.M; j += G * (kThreads / kLanes)) {
        const Pair<float> v = values(l.at(j, c), c, l);
        acc.first += v.first;
        acc.second += v.second;
      }
    rows[row][lane] = acc;
    __syncthreads();
    if (row == 0 && c < l.C) {
      for (int r = 1; r < kThreads / kLanes; ++r) {
        acc.first += rows[r][lane].first;
        acc.second += rows[r][lane].second;
      }
      partial[(g * 2) * l.C + c] = acc.first;
      partial[(g * 2 + 1) * l.C + c] = acc.second;
    }
  } else {
    const int64_t c = blockIdx.x;
    for (int64_t j = g * kThreads + threadIdx.x; j < l.M; j += G * kThreads) {
      const Pair<float> v = values(l.at(j, c), c, l);
      acc.first += v.first;
      acc.second += v.second;
    }
    acc = block_all_reduce(acc, SumOp{});
    if (threadIdx.x == 0) {
      partial[(g * 2) * l.C + c] = acc.first;
      partial[(g * 2 + 1) * l.C + c] = acc.second;
    }
  }
}

// The channel's two sums over the G partials, in order.
__device__ Pair<float> total(const float* partial, int64_t G, int64_t C, int64_t c) {
  Pair<float> s{0.f, 0.f};
  for (int64_t g = 0; g < G; ++g) {
    s.first += partial[(g * 2) * C + c];
    s.second += partial[(g * 2 + 1) * C + c];
  }
  return s;
}

// The forward's statistics and coefficients per channel (partial: null in eval).
template <typename T>
__global__ void forward_finalize_kernel(const T* x, const float* partial, int64_t G, Layout l, const float* weight,
                                        const float* bias, float* running_mean, float* running_var, float* save_mean,
                                        float* save_invstd, float* scale, float momentum, float eps) {
  wait_for_previous_grid();
  allow_next_grid_to_start();
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= l.C) return;
  float mean, var;
  if (partial) {
    const Pair<float> s = total(partial, G, l.C, c);
    const float M = static_cast<float>(l.M), shifted_mean = s.first / M;
    mean = convert_to<float>(x[l.at(0, c)]) + shifted_mean;
    var = fmaxf(s.second / M - shifted_mean * shifted_mean, 0.f);
    if (running_mean) {
      running_mean[c] = (1.f - momentum) * running_mean[c] + momentum * mean;
      running_var[c] = (1.f - momentum) * running_var[c] + momentum * var * M / (M - 1.f);
    }
  } else {
    mean = running_mean[c];
    var = running_var[c];
  }
  const float invstd = rsqrtf(var + eps);
  save_mean[c] = mean;
  save_invstd[c] = invstd;
  scale[c] = weight[c] * invstd;
}

// y = (x - mean) scale + bias, then max(0, .) for batch_norm_relu (a NaN stays NaN, as on the CPU).
template <typename T>
__global__ void forward_apply_kernel(const T* x, T* y, Layout l, const float* mean, const float* scale,
                                     const float* bias, bool relu, int64_t n) {
  wait_for_previous_grid();
  allow_next_grid_to_start();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const int64_t c = l.channel(i);
  float v = (convert_to<float>(x[i]) - mean[c]) * scale[c] + bias[c];
  if (relu && v < 0.f) v = 0.f;
  y[i] = convert_to<T>(v);
}

// dw, db and dx's coefficients per channel: dx = a g' + b + k (x - mean).
__global__ void backward_finalize_kernel(const float* partial, int64_t G, Layout l, const float* weight,
                                         const float* save_invstd, float* dw, float* db, float* coefficients,
                                         bool training) {
  wait_for_previous_grid();
  allow_next_grid_to_start();
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= l.C) return;
  const Pair<float> s = total(partial, G, l.C, c);
  const float invstd = save_invstd[c], k = weight[c] * invstd, M = static_cast<float>(l.M);
  db[c] = s.first;
  dw[c] = s.second * invstd;
  coefficients[c] = k;
  coefficients[l.C + c] = training ? -k * s.first / M : 0.f;
  coefficients[2 * l.C + c] = training ? -k * invstd * invstd * s.second / M : 0.f;
}

template <typename T>
__global__ void backward_apply_kernel(BackwardValues<T> v, T* dx, Layout l, const float* coefficients, int64_t n) {
  wait_for_previous_grid();
  allow_next_grid_to_start();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const int64_t c = l.channel(i);
  const float g = (v.y && !(convert_to<float>(v.y[i]) > 0.f)) ? 0.f : convert_to<float>(v.gy[i]);
  dx[i] = convert_to<T>(coefficients[c] * g + coefficients[l.C + c] +
                        coefficients[2 * l.C + c] * (convert_to<float>(v.x[i]) - v.mean[c]));
}

Layout layout_of(const Tensor& x, MemoryFormat format) {
  const int64_t N = x.size(0), C = x.size(1);
  const int64_t S = C == 0 || N == 0 ? 0 : x.numel() / (N * C);
  return {C, S, N * S, format == MemoryFormat::channels_last};
}

// The channel sums of `values` into a new [G, 2, C] partial; returns it and G.
template <typename Values>
std::pair<Tensor, int64_t> channel_sums(const Values& values, const Layout& l, Device device) {
  const int64_t tiles = l.channels_last ? (l.C + kLanes - 1) / kLanes : l.C;
  const int64_t per_block = l.channels_last ? kThreads / kLanes : kThreads;  // values a block takes per step
  // About four blocks per SM in all, each with at least a few steps of work.
  const int64_t wanted = std::max<int64_t>(1, 4 * multiprocessor_count(device) / std::max<int64_t>(tiles, 1));
  const int64_t G = std::min<int64_t>({wanted, std::max<int64_t>(1, l.M / (4 * per_block)), 65535});
  Tensor partial = empty({G * 2 * l.C}, DType::f32, device);
  launch(channel_sums_kernel<Values>, dim3(static_cast<unsigned>(tiles), static_cast<unsigned>(G)), kThreads, 0,
         stream_for(partial), values, l, data_of<float>(partial));
  PRECIS_CUDA_CHECK_LAUNCH("batch_norm statistics");
  return {partial, G};
}

template <typename Fn>
void dispatch_batch_norm(DType dtype, const char* op, Fn&& fn) {
  dispatch_device<float, __half, __nv_bfloat16>(
      dtype, std::forward<Fn>(fn), op, ": the GPU path takes float32, float16 or bfloat16 tensors, got ", dtype);
}

float* data_or_null(const Tensor& t) { return t.defined() ? data_of<float>(t) : nullptr; }

}  // namespace

void batch_norm_forward(const BatchNormForward& f) {
  const char* op = f.relu ? "batch_norm_relu" : "batch_norm";
  const Layout l = layout_of(f.x, f.format);
  const Device device = f.x.device();
  if (l.C == 0) return;
  Tensor coefficients = empty({l.C}, DType::f32, device);  // scale = weight invstd
  float* scale = data_of<float>(coefficients);
  dispatch_batch_norm(f.x.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* x = data_of<const T>(f.x);
    Tensor partial;
    int64_t G = 0;
    if (f.training && l.M > 0) std::tie(partial, G) = channel_sums(ForwardValues<T>{x}, l, device);
    launch(forward_finalize_kernel<T>, grid_for(l.C), kBlockSize, 0, stream_for(f.y), x,
           partial.defined() ? data_of<const float>(partial) : nullptr, G, l, data_of<const float>(f.weight),
           data_of<const float>(f.bias), data_or_null(f.running_mean), data_or_null(f.running_var),
           data_of<float>(f.save_mean), data_of<float>(f.save_invstd), scale, static_cast<float>(f.momentum),
           static_cast<float>(f.eps));
    PRECIS_CUDA_CHECK_LAUNCH(op);
    const int64_t n = f.x.numel();
    if (n == 0) return;
    launch(forward_apply_kernel<T>, grid_for(n), kBlockSize, 0, stream_for(f.y), x, data_of<T>(f.y), l,
           data_of<const float>(f.save_mean), static_cast<const float*>(scale), data_of<const float>(f.bias), f.relu,
           n);
    PRECIS_CUDA_CHECK_LAUNCH(op);
  });
}

void batch_norm_backward(const BatchNormBackward& b) {
  const char* op = b.y.defined() ? "batch_norm_relu backward" : "batch_norm backward";
  const Layout l = layout_of(b.x, b.format);
  const Device device = b.x.device();
  if (l.C == 0) return;
  Tensor coefficients = empty({3 * l.C}, DType::f32, device);
  dispatch_batch_norm(b.x.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const BackwardValues<T> values{data_of<const T>(b.x), b.y.defined() ? data_of<const T>(b.y) : nullptr,
                                   data_of<const T>(b.gy), data_of<const float>(b.save_mean)};
    if (l.M == 0) {
      fill_(b.dw, 0.0);
      fill_(b.db, 0.0);
      return;
    }
    const auto [partial, G] = channel_sums(values, l, device);
    launch(backward_finalize_kernel, grid_for(l.C), kBlockSize, 0, stream_for(b.dx), data_of<const float>(partial), G,
           l, data_of<const float>(b.weight), data_of<const float>(b.save_invstd), data_of<float>(b.dw),
           data_of<float>(b.db), data_of<float>(coefficients), b.training);
    PRECIS_CUDA_CHECK_LAUNCH(op);
    const int64_t n = b.x.numel();
    launch(backward_apply_kernel<T>, grid_for(n), kBlockSize, 0, stream_for(b.dx), values, data_of<T>(b.dx), l,
           data_of<const float>(coefficients), n);
    PRECIS_CUDA_CHECK_LAUNCH(op);
  });
}

}  // namespace precis::ops::cuda
