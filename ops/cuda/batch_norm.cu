// batch_norm on the GPU (ops/cuda/batch_norm.h): the math of ops/batch_norm.cpp in three
// kernels each way, over x seen as [N, C, S] with M = N S values per channel.
//
//   channel_sums   two sums per channel, f32, of values the caller's functor makes of each
//                  element: a grid of (channel tiles) x G blocks, each block summing a
//                  slice of every one of its channels' M values into its own [G, 2, C]
//                  partial (no atomics: the same order every run);
//   finalize       one warp per channel adds its G partials (lane l takes l, l + 32, ...,
//                  then a butterfly: a fixed order) and derives the per-channel coefficients;
//   apply          one thread per element: y = (x - mean) scale + bias (+ r, then max(0, .)),
//                  or dx. (Not x scale + (bias - mean scale): with |mean| >> std its two large
//                  terms cancel and the output loses the f32 digits the CPU keeps.)
//
// Forward sums (x - p) and (x - p)^2, p = the channel's first value (a "shifted" variance:
// p lies in the data, so the difference E[(x-p)^2] - E[x-p]^2 does not cancel as
// E[x^2] - E[x]^2 would when |mean| >> std): mean = p + s1 / M, var = s2 / M - (s1 / M)^2,
// and the running statistics r <- (1 - momentum) r + momentum (mean, var M / (M - 1)).
// Eval skips the sums: mean, var are the running ones.
// Backward sums g' and g' (x - mean), g' = g, or g [y > 0] for the relu variants (and
// batch_norm_add_relu's sums pass stores g', r's gradient, for the dx pass to read).
// batch_norm_relu's mask comes from x where y was not kept: the forward's value
// fma(x - mean, w invstd, bias) again, the same f32 operations on the same numbers, rounded to
// T as y was: T(v) > 0 exactly where y > 0, at the price of an fma per element instead of a
// tensor read.
//   db = sum g',  dw = invstd sum g' (x - mean),  k = w invstd, and
//   training: dx = k g' - k db / M - (x - mean) k invstd dw / M;   eval: dx = k g'.
//
// Layouts: NCHW puts a channel's values in N runs of S; a block of 256 threads takes one
// channel, consecutive threads consecutive values. Channels-last puts the C channels of a
// cell side by side; a block takes 32 channels, its 8 warps' lanes reading 32 neighbours.
// Channels-last with C a multiple of V = 16 bytes of T (8 f16/bf16, 4 f32) and 16-byte aligned
// buffers (every ResNet layer) takes the packed kernels instead: a thread owns V neighbouring
// channels, moves them with one 16-byte access per cell, and keeps their per-channel numbers
// (the shift or mean, scale, bias, dx's coefficients) in registers across the cells it visits;
// a block is tx threads across channel packs by ty cells, summed over ty by a fixed tree.
#include <algorithm>
#include <atomic>
#include <initializer_list>
#include <tuple>

#include "core/copy.h"
#include "core/cuda/block_reduce.cuh"
#include "core/cuda/convert.cuh"
#include "core/cuda/dispatch.cuh"
#include "core/cuda/launch.cuh"
#include "core/cuda/pack.cuh"
#include "core/env_switch.h"
#include "ops/cuda/batch_norm.h"
#include "ops/cuda/bulk_copy.cuh"  // cp_async_16

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

// The normalised value (x - mean) scale + bias, rounded once: the forward's apply, and the
// backward where it recomputes batch_norm_relu's mask from x, so that both get the same bits.
__device__ __forceinline__ float normalized(float x, float mean, float scale, float bias) {
  return __fmaf_rn(x - mean, scale, bias);
}

// Whether the relu passes the gradient at v, the value before it, for a y stored as T: where
// T(max(0, v)) > 0, the test the mask from y makes (a NaN passes neither way).
template <typename T>
__device__ __forceinline__ bool relu_passes(float v) {
  return convert_to<float>(convert_to<T>(v)) > 0.f;
}

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
  T* gprime;  // where g' goes (batch_norm_add_relu's dr), or null
  const float *weight, *invstd;
  const float* relu_bias;  // y null and this not: the relu's mask from x (relu_passes)
  // g' at i: gy where the relu (if any) passes it, else 0.
  __device__ float gradient(int64_t i, int64_t c) const {
    const bool blocked = y ? !(convert_to<float>(y[i]) > 0.f)
                           : relu_bias && !relu_passes<T>(normalized(convert_to<float>(x[i]), mean[c],
                                                                     weight[c] * invstd[c], relu_bias[c]));
    return blocked ? 0.f : convert_to<float>(gy[i]);
  }
  __device__ Pair<float> operator()(int64_t i, int64_t c, const Layout&) const {
    const float g = gradient(i, c);
    if (gprime) gprime[i] = convert_to<T>(g);
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

// The finalize kernels' warp per channel: blocks of kThreads, kThreads / 32 channels each.
constexpr int kChannelsPerBlock = kThreads / 32;
__device__ int64_t warp_channel() { return static_cast<int64_t>(blockIdx.x) * kChannelsPerBlock + threadIdx.x / 32; }

// The channel's two sums over the G partials, in every lane of the warp: lane l adds partials
// l, l + 32, ... (loads in flight together, where one thread adding all G waited on each in
// turn; unrolled, so that a lane's next loads are issued before its first sums wait), then the
// warp's butterfly. Every lane of the warp must call it. G < 65536.
__device__ Pair<float> total(const float* partial, int64_t G, int64_t C, int64_t c) {
  Pair<float> s{0.f, 0.f};
#pragma unroll 8
  for (int g = threadIdx.x % 32; g < static_cast<int>(G); g += 32) {
    s.first += partial[(g * 2) * C + c];
    s.second += partial[(g * 2 + 1) * C + c];
  }
  return warp_all_reduce(s, SumOp{});
}

// The forward's statistics and coefficients per channel (partial: null in eval).
template <typename T>
__global__ void forward_finalize_kernel(const T* x, const float* partial, int64_t G, Layout l, const float* weight,
                                        const float* bias, float* running_mean, float* running_var, float* save_mean,
                                        float* save_invstd, float* scale, float momentum, float eps,
                                        int64_t* num_batches_tracked) {
  wait_for_previous_grid();
  allow_next_grid_to_start();
  const int64_t c = warp_channel();
  if (c >= l.C) return;  // the whole warp
  float mean, var;
  if (partial) {
    const Pair<float> s = total(partial, G, l.C, c);
    if (threadIdx.x % 32 != 0) return;
    const float M = static_cast<float>(l.M), shifted_mean = s.first / M;
    mean = convert_to<float>(x[l.at(0, c)]) + shifted_mean;
    var = fmaxf(s.second / M - shifted_mean * shifted_mean, 0.f);
    if (running_mean) {
      running_mean[c] = (1.f - momentum) * running_mean[c] + momentum * mean;
      running_var[c] = (1.f - momentum) * running_var[c] + momentum * var * M / (M - 1.f);
    }
  } else {
    if (threadIdx.x % 32 != 0) return;
    mean = running_mean[c];
    var = running_var[c];
  }
  if (num_batches_tracked && c == 0) ++*num_batches_tracked;
  const float invstd = rsqrtf(var + eps);
  save_mean[c] = mean;
  save_invstd[c] = invstd;
  scale[c] = weight[c] * invstd;
}

// y = (x - mean) scale + bias (+ r), then max(0, .) for the relu variants (a NaN stays NaN, as on
// the CPU).
template <typename T>
__global__ void forward_apply_kernel(const T* x, const T* r, T* y, Layout l, const float* mean, const float* scale,
                                     const float* bias, bool relu, int64_t n) {
  wait_for_previous_grid();
  allow_next_grid_to_start();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const int64_t c = l.channel(i);
  float v = normalized(convert_to<float>(x[i]), mean[c], scale[c], bias[c]);
  if (r) v += convert_to<float>(r[i]);
  if (relu && v < 0.f) v = 0.f;
  y[i] = convert_to<T>(v);
}

// dw, db and dx's coefficients per channel: dx = a g' + b + k (x - mean).
__global__ void backward_finalize_kernel(const float* partial, int64_t G, Layout l, const float* weight,
                                         const float* save_invstd, float* dw, float* db, float* coefficients,
                                         bool training, bool accumulate_dw, bool accumulate_db) {
  wait_for_previous_grid();
  allow_next_grid_to_start();
  const int64_t c = warp_channel();
  if (c >= l.C) return;  // the whole warp
  const Pair<float> s = total(partial, G, l.C, c);
  if (threadIdx.x % 32 != 0) return;
  const float invstd = save_invstd[c], k = weight[c] * invstd, M = static_cast<float>(l.M);
  db[c] = accumulate_db ? db[c] + s.first : s.first;
  dw[c] = accumulate_dw ? dw[c] + s.second * invstd : s.second * invstd;
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
  const float g = v.gprime ? convert_to<float>(v.gprime[i]) : v.gradient(i, c);
  dx[i] = convert_to<T>(coefficients[c] * g + coefficients[l.C + c] +
                        coefficients[2 * l.C + c] * (convert_to<float>(v.x[i]) - v.mean[c]));
}

// ---- channels-last, packed: V = 16 bytes of T neighbouring channels per thread

// Block (tx, ty): tx threads across the channel packs (at most 32), ty cells (a power of two,
// tx ty <= kThreads); tiles blocks of tx packs cover the C / V packs.
struct PackedShape {
  int tx, ty;
  int64_t tiles;
};

PackedShape packed_shape(int64_t packs) {
  PackedShape s{static_cast<int>(std::min<int64_t>(packs, kLanes)), 1, 0};
  while (2 * s.tx * s.ty <= kThreads) s.ty *= 2;
  s.tiles = (packs + s.tx - 1) / s.tx;
  return s;
}

// What the packed statistics pass reads (forward: x; backward: x, gy, y or null, and writes
// g' where gprime is not null; the relu's mask from x with weight, invstd and relu_bias, as
// BackwardValues).
template <typename T>
struct PackedSums {
  const T* x;
  const T* y;
  const T* gy;
  const float* mean;
  T* gprime;
  const float *weight, *invstd, *relu_bias;
};

// As channel_sums_kernel, V channels a thread: forward sums x - p and (x - p)^2 (p the channel's
// first value), backward g' and g' (x - mean). The block's ty partial sums of each channel are
// added by a tree (rows r and r + stride, stride halving), the same order every run.
// kMask: where the backward's relu mask comes from (a.y or x, as BackwardValues), if any.
enum class Mask { none, from_y, from_x };
// The statistics pass's shape: each thread issues kBatch cells' loads together, and kBlocks
// blocks are resident on every SM, the grid one wave of them. Two blocks (the launch bounds cap
// a thread at 128 registers) batch 4 cells, or 3 for a backward that also loads y (or
// recomputes the mask from x), to fit those registers without spilling (ptxas -v;
// bench/NOTES.md); one block (small tensors: packed_channel_sums) batches twice as many.
// Uncapped, the backward took 165 registers: one block an SM, and the grid ran in two waves.
constexpr int kStatsBlocks = 2;
template <Mask kMask, int kBlocks>
constexpr int stats_batch() {
  return kBlocks == 1 ? (kMask == Mask::none ? 8 : 6) : (kMask == Mask::none ? 4 : 3);
}
// One thread's part of a packed statistics pass (packed_sums_kernel, staged_sums_kernel): its
// V channels' constants and running sums, the sums of one cell, and the block's tree.
template <typename T, bool kBackward, Mask kMask>
struct PackedStatsThread {
  static constexpr int V = Packed128<T>::size;
  float s1[V], s2[V], ref[V], scale[V], bias[V];

  __device__ void clear() {
#pragma unroll
    for (int k = 0; k < V; ++k) s1[k] = s2[k] = 0.f;
  }
  // The constants of channels c0 .. c0 + V - 1 (c0 < C): backward the mean (and, for the mask
  // from x, the forward's scale and bias), forward the shift p, cell 0's value.
  __device__ void start(const PackedSums<T>& a, int64_t c0) {
    if constexpr (kBackward) {
#pragma unroll
      for (int k = 0; k < V; ++k) ref[k] = a.mean[c0 + k];
      if constexpr (kMask == Mask::from_x) {
#pragma unroll
        for (int k = 0; k < V; ++k) {
          scale[k] = a.weight[c0 + k] * a.invstd[c0 + k];
          bias[k] = a.relu_bias[c0 + k];
        }
      }
    } else {
      const Packed128<T> p = load_pack<V>(a.x + c0);  // cell 0
#pragma unroll
      for (int k = 0; k < V; ++k) ref[k] = convert_to<float>(p.v[k]);
    }
  }
  // Adds cell j of channels c0..: x, and backward g = gy there (masked in place into g'; y: the
  // relu's output, for the mask from y), storing g' where a.gprime asks for it.
  __device__ void add(const Packed128<T>& x, Packed128<T>& g, const Packed128<T>& y, int64_t j, const PackedSums<T>& a,
                      const Layout& l, int64_t c0) {
    if constexpr (kBackward) {
      if constexpr (kMask == Mask::from_x) {
#pragma unroll
        for (int k = 0; k < V; ++k)
          if (!relu_passes<T>(normalized(convert_to<float>(x.v[k]), ref[k], scale[k], bias[k])))
            g.v[k] = convert_to<T>(0.f);
      } else if constexpr (kMask == Mask::from_y) {
#pragma unroll
        for (int k = 0; k < V; ++k)
          if (!(convert_to<float>(y.v[k]) > 0.f)) g.v[k] = convert_to<T>(0.f);
      }
      if (a.gprime) store_pack(a.gprime + j * l.C + c0, g);
#pragma unroll
      for (int k = 0; k < V; ++k) {
        const float gk = convert_to<float>(g.v[k]);
        s1[k] += gk;
        s2[k] += gk * (convert_to<float>(x.v[k]) - ref[k]);
      }
    } else {
#pragma unroll
      for (int k = 0; k < V; ++k) {
        const float d = convert_to<float>(x.v[k]) - ref[k];
        s1[k] += d;
        s2[k] += d * d;
      }
    }
  }
  // The block's ty sums of each channel added by a tree in `rows` (kThreads 2 V floats of shared
  // memory; rows r and r + stride, stride halving: the same order every run); row 0 writes the
  // block's partial. Every thread of the block calls it.
  __device__ void finish(float* rows, const Layout& l, int64_t c0, float* partial) const {
    const int tx = threadIdx.x, ty = threadIdx.y;
    float* mine = rows + (ty * blockDim.x + tx) * 2 * V;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      mine[k] = s1[k];
      mine[V + k] = s2[k];
    }
    for (int stride = blockDim.y / 2; stride > 0; stride /= 2) {
      __syncthreads();
      if (ty < stride) {
        const float* other = rows + ((ty + stride) * blockDim.x + tx) * 2 * V;
#pragma unroll
        for (int k = 0; k < 2 * V; ++k) mine[k] += other[k];
      }
    }
    if (ty == 0 && c0 < l.C) {
      const int64_t g = blockIdx.y;
#pragma unroll
      for (int k = 0; k < V; ++k) {
        partial[(g * 2) * l.C + c0 + k] = mine[k];
        partial[(g * 2 + 1) * l.C + c0 + k] = mine[V + k];
      }
    }
  }
};

template <typename T, bool kBackward, Mask kMask, int kBlocks>
__global__ void __launch_bounds__(kThreads, kBlocks) packed_sums_kernel(PackedSums<T> a, Layout l, float* partial) {
  constexpr int kBatch = stats_batch<kMask, kBlocks>();
  wait_for_previous_grid();
  allow_next_grid_to_start();
  constexpr int V = Packed128<T>::size;
  __shared__ float rows[kThreads * 2 * V];
  const int64_t c0 = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * V;
  PackedStatsThread<T, kBackward, kMask> me;
  me.clear();
  if (c0 < l.C) {
    me.start(a, c0);
    // kBatch cells' loads are issued before any of them is summed, so that each thread keeps
    // kBatch 16-byte loads of each operand in flight (a loop whose sums wait on each load in
    // turn kept the statistics pass at a third of the bandwidth).
    const int64_t stride = static_cast<int64_t>(gridDim.y) * blockDim.y;
    for (int64_t j0 = static_cast<int64_t>(blockIdx.y) * blockDim.y + threadIdx.y; j0 < l.M; j0 += kBatch * stride) {
      Packed128<T> x[kBatch], g[kBatch], y[kBatch];
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const int64_t j = j0 + u * stride;
        if (j >= l.M) continue;
        x[u] = load_pack<V>(a.x + j * l.C + c0);
        if constexpr (kBackward) {
          g[u] = load_pack<V>(a.gy + j * l.C + c0);
          if constexpr (kMask == Mask::from_y) y[u] = load_pack<V>(a.y + j * l.C + c0);
        }
      }
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const int64_t j = j0 + u * stride;
        if (j < l.M) me.add(x[u], g[u], y[u], j, a, l, c0);
      }
    }
  }
  me.finish(rows, l, c0, partial);
}

// packed_sums_kernel with its loads staged through shared memory (the default where a block's
// ring fits; PRECIS_BN_STAGED_STATS=0 turns it off): each thread copies its own cells' packs into a ring of kStages
// stages of shared memory (cp.async, no registers held), kStages - 1 stages ahead of the cells it sums, so the copies
// stay in flight while it sums (packed_sums_kernel issues kBatch cells' loads into registers, waits, sums, and only
// then issues more). One block an SM, the cells of each thread and their order as packed_sums_kernel<..., 1>'s: the
// same sums, bit for bit. kStagedCells cells of every operand a stage: 512-576 bytes a thread in all, so a block's ring
// (and the tree's rows) fits an A100's shared memory too.
constexpr int kStages = 4;
template <bool kBackward, Mask kMask>
constexpr int staged_operands() {
  return kBackward ? (kMask == Mask::from_y ? 3 : 2) : 1;
}
template <bool kBackward, Mask kMask>
constexpr int staged_cells() {
  return staged_operands<kBackward, kMask>() == 1 ? 8 : staged_operands<kBackward, kMask>() == 2 ? 4 : 3;
}
template <bool kBackward, Mask kMask>
constexpr int staged_bytes_per_thread() {
  return kStages * staged_cells<kBackward, kMask>() * staged_operands<kBackward, kMask>() * 16;
}
template <typename T, bool kBackward, Mask kMask>
__global__ void __launch_bounds__(kThreads, 1) staged_sums_kernel(PackedSums<T> a, Layout l, float* partial) {
  constexpr int kCells = staged_cells<kBackward, kMask>(), kOps = staged_operands<kBackward, kMask>();
  constexpr int V = Packed128<T>::size;
  wait_for_previous_grid();
  allow_next_grid_to_start();
  extern __shared__ uint4 ring_bytes[];  // [kStages][kCells][kOps][threads]: a thread's 16 bytes side by side
  Packed128<T>* ring = reinterpret_cast<Packed128<T>*>(ring_bytes);
  __shared__ float rows[kThreads * 2 * V];
  const int threads = blockDim.x * blockDim.y, mine = threadIdx.y * blockDim.x + threadIdx.x;
  const int64_t c0 = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * V;
  auto slot = [&](int64_t round, int u, int op) -> Packed128<T>& {
    return ring[((static_cast<int>(round % kStages) * kCells + u) * kOps + op) * threads + mine];
  };
  PackedStatsThread<T, kBackward, kMask> me;
  me.clear();
  if (c0 < l.C) {
    me.start(a, c0);
    const int64_t stride = static_cast<int64_t>(gridDim.y) * blockDim.y, round = kCells * stride;
    const int64_t first = static_cast<int64_t>(blockIdx.y) * blockDim.y + threadIdx.y;
    // Copies the cells of round r (from first + r round on) into its stage, r mod kStages, as one
    // group (empty past the end, so that every round has its group and the waits count alike).
    auto issue = [&](int64_t r) {
#pragma unroll
      for (int u = 0; u < kCells; ++u) {
        const int64_t j = first + r * round + u * stride;
        if (j < l.M) {
          cp_async_16(&slot(r, u, 0), a.x + j * l.C + c0, true);
          if constexpr (kBackward) {
            cp_async_16(&slot(r, u, 1), a.gy + j * l.C + c0, true);
            if constexpr (kMask == Mask::from_y) cp_async_16(&slot(r, u, 2), a.y + j * l.C + c0, true);
          }
        }
      }
      cp_async_commit();
    };
#pragma unroll
    for (int r = 0; r < kStages - 1; ++r) issue(r);
    for (int64_t r = 0; first + r * round < l.M; ++r) {
      issue(r + kStages - 1);        // into the stage round r - 1 was summed from
      cp_async_wait<kStages - 1>();  // round r's group has landed
#pragma unroll
      for (int u = 0; u < kCells; ++u) {
        const int64_t j = first + r * round + u * stride;
        if (j >= l.M) continue;
        Packed128<T> g = slot(r, u, kOps > 1 ? 1 : 0);
        me.add(slot(r, u, 0), g, slot(r, u, kOps - 1), j, a, l, c0);
      }
    }
    cp_async_wait<0>();  // the empty groups past the end, before the block exits
  }
  me.finish(rows, l, c0, partial);
}

// forward_apply_kernel, V channels a thread, their mean, scale and bias held across its cells.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    packed_forward_apply_kernel(const T* x, const T* r, T* y, Layout l, const float* mean, const float* scale,
                                const float* bias, bool relu) {
  wait_for_previous_grid();
  allow_next_grid_to_start();
  constexpr int V = Packed128<T>::size;
  const int64_t c0 = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * V;
  if (c0 >= l.C) return;
  float m[V], sc[V], b[V];
#pragma unroll
  for (int k = 0; k < V; ++k) {
    m[k] = mean[c0 + k];
    sc[k] = scale[c0 + k];
    b[k] = bias[c0 + k];
  }
#pragma unroll 2
  for (int64_t j = static_cast<int64_t>(blockIdx.y) * blockDim.y + threadIdx.y; j < l.M;
       j += static_cast<int64_t>(gridDim.y) * blockDim.y) {
    const int64_t i = j * l.C + c0;
    const Packed128<T> xv = load_pack<V>(x + i);
    Packed128<T> rv;
    if (r) rv = load_pack<V>(r + i);
    Packed128<T> out;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      float v = normalized(convert_to<float>(xv.v[k]), m[k], sc[k], b[k]);
      if (r) v += convert_to<float>(rv.v[k]);
      if (relu && v < 0.f) v = 0.f;
      out.v[k] = convert_to<T>(v);
    }
    store_pack(y + i, out);
  }
}

// backward_apply_kernel, V channels a thread: dx = a g' + b + k (x - mean), with g' read from
// gprime where the statistics pass wrote it, else gy masked by y > 0 (y not null), by the mask
// from x (relu_bias not null, as BackwardValues), or gy.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    packed_backward_apply_kernel(const T* x, const T* y, const T* gy, const T* gprime, T* dx, Layout l,
                                 const float* mean, const float* coefficients, const float* weight, const float* invstd,
                                 const float* relu_bias) {
  wait_for_previous_grid();
  allow_next_grid_to_start();
  constexpr int V = Packed128<T>::size;
  const int64_t c0 = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * V;
  if (c0 >= l.C) return;
  float m[V], a[V], b[V], k2[V];
#pragma unroll
  for (int k = 0; k < V; ++k) {
    m[k] = mean[c0 + k];
    a[k] = coefficients[c0 + k];
    b[k] = coefficients[l.C + c0 + k];
    k2[k] = coefficients[2 * l.C + c0 + k];
  }
  const T* g_in = gprime ? gprime : gy;
  const T* mask = gprime ? nullptr : y;
  const bool mask_from_x = !gprime && !y && relu_bias;
  float scale[V], bias[V];
  if (mask_from_x) {
#pragma unroll
    for (int k = 0; k < V; ++k) {
      scale[k] = weight[c0 + k] * invstd[c0 + k];
      bias[k] = relu_bias[c0 + k];
    }
  }
#pragma unroll 2
  for (int64_t j = static_cast<int64_t>(blockIdx.y) * blockDim.y + threadIdx.y; j < l.M;
       j += static_cast<int64_t>(gridDim.y) * blockDim.y) {
    const int64_t i = j * l.C + c0;
    const Packed128<T> xv = load_pack<V>(x + i);
    const Packed128<T> gv = load_pack<V>(g_in + i);
    Packed128<T> yv;
    if (mask) yv = load_pack<V>(mask + i);
    Packed128<T> out;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const float xk = convert_to<float>(xv.v[k]);
      const bool blocked = mask          ? !(convert_to<float>(yv.v[k]) > 0.f)
                           : mask_from_x ? !relu_passes<T>(normalized(xk, m[k], scale[k], bias[k]))
                                         : false;
      const float g = blocked ? 0.f : convert_to<float>(gv.v[k]);
      out.v[k] = convert_to<T>(a[k] * g + b[k] + k2[k] * (xk - m[k]));
    }
    store_pack(dx + i, out);
  }
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

// Whether the packed channels-last kernels take the problem: C a multiple of V and every buffer
// (null ones aside) 16-byte aligned.
template <typename T>
bool packed(const Layout& l, std::initializer_list<const void*> buffers) {
  if (!l.channels_last || l.C % Packed128<T>::size != 0) return false;
  for (const void* p : buffers)
    if (p && !aligned16(p)) return false;
  return true;
}

// The statistics grid's rows G (its partials a channel): kBlocks blocks per SM over the tiles,
// each thread with kBatch loads of each operand in flight, keep the memory busy; more blocks
// would only lengthen the finalize kernel's walk over the G partials. Each thread takes at least
// one batch.
template <Mask kMask, int kBlocks>
int64_t stats_rows(const Layout& l, const PackedShape& s, Device device) {
  constexpr int kBatch = stats_batch<kMask, kBlocks>();
  const int64_t wanted = std::max<int64_t>(1, kBlocks * multiprocessor_count(device) / s.tiles);
  return std::min<int64_t>({wanted, std::max<int64_t>(1, l.M / (kBatch * s.ty)), 65535});
}

// channel_sums by packed_sums_kernel: its [G, 2, C] partial and G.
template <typename T, bool kBackward, Mask kMask, int kBlocks>
std::pair<Tensor, int64_t> packed_channel_sums_as(const PackedSums<T>& a, const Layout& l, Device device) {
  const PackedShape s = packed_shape(l.C / Packed128<T>::size);
  const int64_t G = stats_rows<kMask, kBlocks>(l, s, device);
  Tensor partial = empty({G * 2 * l.C}, DType::f32, device);
  launch(packed_sums_kernel<T, kBackward, kMask, kBlocks>,
         dim3(static_cast<unsigned>(s.tiles), static_cast<unsigned>(G)), dim3(s.tx, s.ty), 0, stream_for(partial), a, l,
         data_of<float>(partial));
  PRECIS_CUDA_CHECK_LAUNCH("batch_norm statistics");
  return {partial, G};
}

// Where the staged kernel is off or does not fit: tensors under this many bytes (one operand)
// take the statistics pass at one block per SM,
// each thread with twice the loads in flight: half the partials for the finalize kernel to
// walk, and the loads of a small layer issued in one round. Larger ones keep two blocks per SM,
// which hide the memory's latency better over many rounds (the threshold was measured:
// bench/NOTES.md).
constexpr int64_t kSmallStatsBytes = int64_t{40} << 20;

EnvSwitch g_staged_statistics("PRECIS_BN_STAGED_STATS", /*default_on=*/true);
std::atomic<int64_t> g_staged_launches{0};

// channel_sums by staged_sums_kernel, on packed_channel_sums_as<..., 1>'s grid (the same
// partials, bit for bit).
template <typename T, bool kBackward, Mask kMask>
std::pair<Tensor, int64_t> staged_channel_sums(const PackedSums<T>& a, const Layout& l, Device device) {
  const PackedShape s = packed_shape(l.C / Packed128<T>::size);
  const int64_t G = stats_rows<kMask, 1>(l, s, device);
  Tensor partial = empty({G * 2 * l.C}, DType::f32, device);
  launch_with_shared_memory(staged_sums_kernel<T, kBackward, kMask>,
                            dim3(static_cast<unsigned>(s.tiles), static_cast<unsigned>(G)), dim3(s.tx, s.ty),
                            staged_bytes_per_thread<kBackward, kMask>() * s.tx * s.ty, stream_for(partial),
                            "batch_norm statistics", a, l, data_of<float>(partial));
  PRECIS_CUDA_CHECK_LAUNCH("batch_norm statistics");
  g_staged_launches.fetch_add(1, std::memory_order_relaxed);
  return {partial, G};
}

// Whether a block of staged_sums_kernel (its ring and its tree's rows) fits the device's shared
// memory: on an H100 or an A100 it does; elsewhere the register-batched kernel takes the pass.
template <typename T, bool kBackward, Mask kMask>
bool staged_fits(Device device) {
  const int ring = staged_bytes_per_thread<kBackward, kMask>() * kThreads;
  const int rows = kThreads * 2 * Packed128<T>::size * static_cast<int>(sizeof(float));
  return ring + rows <= shared_memory_per_block_optin(device);
}

template <typename T, bool kBackward, Mask kMask>
std::pair<Tensor, int64_t> packed_channel_sums(const PackedSums<T>& a, const Layout& l, Device device) {
  if (g_staged_statistics.on() && staged_fits<T, kBackward, kMask>(device))
    return staged_channel_sums<T, kBackward, kMask>(a, l, device);
  if (l.M * l.C * static_cast<int64_t>(sizeof(T)) < kSmallStatsBytes)
    return packed_channel_sums_as<T, kBackward, kMask, 1>(a, l, device);
  return packed_channel_sums_as<T, kBackward, kMask, kStatsBlocks>(a, l, device);
}

// The packed apply kernels' grid: about eight blocks per SM (the device full), each cell once.
dim3 packed_apply_grid(const PackedShape& s, const Layout& l, Device device) {
  const int64_t wanted = std::max<int64_t>(1, 8 * multiprocessor_count(device) / s.tiles);
  const int64_t G = std::min<int64_t>({wanted, std::max<int64_t>(1, (l.M + s.ty - 1) / s.ty), 65535});
  return dim3(static_cast<unsigned>(s.tiles), static_cast<unsigned>(G));
}

// The finalize kernels' grid: a warp per channel.
unsigned finalize_blocks(const Layout& l) {
  return static_cast<unsigned>((l.C + kChannelsPerBlock - 1) / kChannelsPerBlock);
}

template <typename Fn>
void dispatch_batch_norm(DType dtype, const char* op, Fn&& fn) {
  dispatch_device<float, __half, __nv_bfloat16>(
      dtype, std::forward<Fn>(fn), op, ": the GPU path takes float32, float16 or bfloat16 tensors, got ", dtype);
}

float* data_or_null(const Tensor& t) { return t.defined() ? data_of<float>(t) : nullptr; }

}  // namespace

void batch_norm_forward(const BatchNormForward& f) {
  const char* op = f.residual.defined() ? "batch_norm_add_relu" : f.relu ? "batch_norm_relu" : "batch_norm";
  const Layout l = layout_of(f.x, f.format);
  const Device device = f.x.device();
  if (l.C == 0) return;
  Tensor coefficients = empty({l.C}, DType::f32, device);  // scale = weight invstd
  float* scale = data_of<float>(coefficients);
  dispatch_batch_norm(f.x.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* x = data_of<const T>(f.x);
    const T* r = f.residual.defined() ? data_of<const T>(f.residual) : nullptr;
    const bool is_packed = packed<T>(l, {x, r, f.y.raw_data()});
    Tensor partial;
    int64_t G = 0;
    if (f.training && l.M > 0) {
      std::tie(partial, G) = is_packed
                                 ? packed_channel_sums<T, false, Mask::none>(
                                       {x, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr}, l, device)
                                 : channel_sums(ForwardValues<T>{x}, l, device);
    }
    launch(forward_finalize_kernel<T>, finalize_blocks(l), kThreads, 0, stream_for(f.y), x,
           partial.defined() ? data_of<const float>(partial) : nullptr, G, l, data_of<const float>(f.weight),
           data_of<const float>(f.bias), data_or_null(f.running_mean), data_or_null(f.running_var),
           data_of<float>(f.save_mean), data_of<float>(f.save_invstd), scale, static_cast<float>(f.momentum),
           static_cast<float>(f.eps),
           f.num_batches_tracked.defined() ? data_of<int64_t>(f.num_batches_tracked) : nullptr);
    PRECIS_CUDA_CHECK_LAUNCH(op);
    const int64_t n = f.x.numel();
    if (n == 0) return;
    if (is_packed) {
      const PackedShape shape = packed_shape(l.C / Packed128<T>::size);
      launch(packed_forward_apply_kernel<T>, packed_apply_grid(shape, l, device), dim3(shape.tx, shape.ty), 0,
             stream_for(f.y), x, r, data_of<T>(f.y), l, data_of<const float>(f.save_mean),
             static_cast<const float*>(scale), data_of<const float>(f.bias), f.relu);
    } else {
      launch(forward_apply_kernel<T>, grid_for(n), kBlockSize, 0, stream_for(f.y), x, r, data_of<T>(f.y), l,
             data_of<const float>(f.save_mean), static_cast<const float*>(scale), data_of<const float>(f.bias), f.relu,
             n);
    }
    PRECIS_CUDA_CHECK_LAUNCH(op);
  });
}

void batch_norm_backward(const BatchNormBackward& b) {
  const char* op = b.dr.defined()                           ? "batch_norm_add_relu backward"
                   : b.y.defined() || b.relu_bias.defined() ? "batch_norm_relu backward"
                                                            : "batch_norm backward";
  const Layout l = layout_of(b.x, b.format);
  const Device device = b.x.device();
  if (l.C == 0) return;
  Tensor coefficients = empty({3 * l.C}, DType::f32, device);
  dispatch_batch_norm(b.x.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* x = data_of<const T>(b.x);
    const T* y = b.y.defined() ? data_of<const T>(b.y) : nullptr;
    const T* gy = data_of<const T>(b.gy);
    T* gprime = b.dr.defined() ? data_of<T>(b.dr) : nullptr;
    const float* mean = data_of<const float>(b.save_mean);
    const float *weight = data_of<const float>(b.weight), *invstd = data_of<const float>(b.save_invstd);
    const float* relu_bias = !y && b.relu_bias.defined() ? data_of<const float>(b.relu_bias) : nullptr;
    if (l.M == 0) {  // no values: zero sums
      if (!b.accumulate_dw) fill_(b.dw, 0.0);
      if (!b.accumulate_db) fill_(b.db, 0.0);
      return;
    }
    const bool is_packed = packed<T>(l, {x, y, gy, gprime, b.dx.raw_data()});
    const BackwardValues<T> values{x, y, gy, mean, gprime, weight, invstd, relu_bias};
    const PackedSums<T> sums{x, y, gy, mean, gprime, weight, invstd, relu_bias};
    const auto [partial, G] = !is_packed  ? channel_sums(values, l, device)
                              : relu_bias ? packed_channel_sums<T, true, Mask::from_x>(sums, l, device)
                              : y         ? packed_channel_sums<T, true, Mask::from_y>(sums, l, device)
                                          : packed_channel_sums<T, true, Mask::none>(sums, l, device);
    launch(backward_finalize_kernel, finalize_blocks(l), kThreads, 0, stream_for(b.dx), data_of<const float>(partial),
           G, l, data_of<const float>(b.weight), data_of<const float>(b.save_invstd), data_of<float>(b.dw),
           data_of<float>(b.db), data_of<float>(coefficients), b.training, b.accumulate_dw, b.accumulate_db);
    PRECIS_CUDA_CHECK_LAUNCH(op);
    if (is_packed) {
      const PackedShape shape = packed_shape(l.C / Packed128<T>::size);
      launch(packed_backward_apply_kernel<T>, packed_apply_grid(shape, l, device), dim3(shape.tx, shape.ty), 0,
             stream_for(b.dx), x, y, gy, static_cast<const T*>(gprime), data_of<T>(b.dx), l, mean,
             data_of<const float>(coefficients), weight, invstd, relu_bias);
    } else {
      launch(backward_apply_kernel<T>, grid_for(b.x.numel()), kBlockSize, 0, stream_for(b.dx), values, data_of<T>(b.dx),
             l, data_of<const float>(coefficients), b.x.numel());
    }
    PRECIS_CUDA_CHECK_LAUNCH(op);
  });
}

void set_staged_batch_norm_statistics(bool on) { g_staged_statistics.set(on); }
int64_t staged_batch_norm_statistics_launches() { return g_staged_launches.load(); }

}  // namespace precis::ops::cuda
