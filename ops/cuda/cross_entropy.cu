// cross_entropy: log-softmax and NLL fused over rows of C logits (the math is derived in
// ops/cross_entropy.cpp), in the manner of llm.c's fused classifier:
//   forward:  per row the online (max m, sum s), loss_r = (m - x_t) + log s, stats (m, log s);
//             then one block adds the rows' losses in row order and divides by the number of
//             rows whose target is not ignore_index (deterministic; NaN when there are none).
//   backward: dx_j = g (exp((x_j - m) - log s) - [j == t]) / n_valid, recomputed from the
//             logits and the saved stats in one pass; zeros where the target is ignored.
//             For 16-byte-aligned rows (GPT-2's padded classifier) the pass runs over
//             dlogits as one flat array, several 16-byte packs in flight per thread
//             (cross_entropy_backward_flat_kernel): one block per row kept a single load
//             in flight per thread and moved ~1.2 TB/s.
//   fused:    both in one kernel when the gradient the loss will receive is known before the
//             forward (the trainer's loss scale / micro-batches, on the device): a count pass
//             over the targets (n_valid, the target check), then per row (m, s) and the
//             gradient, written over the logits when asked; the logits leave memory once
//             instead of twice (~1.65 GB less per GPT-2 step). Rows up to 16384 values read the
//             row twice (the second read from L2); longer rows that fit 110 KiB (GPT-2's 50304
//             bf16 values) are staged in shared memory, read from memory once: on sm_90 the
//             copy engine brings the whole row in at once (cross_entropy_fused_bulk_kernel),
//             elsewhere the threads load it (cross_entropy_fused_staged_kernel). The bulk
//             kernel's exponentials are one ex2 instruction each (exp2_fast).
// Logits stay in their dtype (f16/bf16 are read as they are, no f32 copy is made or
// kept); the math is f32 (f64 for f64 logits), and dlogits are written in the logits' dtype.
// Logit rows are `ld` elements apart (ld >= C: e.g. the real columns of a padded classifier
// output); dlogits rows are `width` >= C apart, and the backward writes zeros in their
// columns [C, width), the padding, in the same pass.
//
// Targets are checked on the device, by the forward kernel that reads them anyway: a row
// whose target is neither ignore_index nor in [0, C) records its index in a flag (atomicMin,
// so the first such row is reported) and is never used to index the logits. The flag is
// copied back once per forward (8 bytes and a stream synchronisation), cheaper than copying
// every target to the host to check them there.
#include <atomic>
#include <limits>

#include "core/cuda/block_reduce.cuh"
#include "core/cuda/convert.cuh"
#include "core/cuda/dispatch.cuh"
#include "core/cuda/launch.cuh"
#include "core/cuda/pack.cuh"
#include "core/env_switch.h"
#include "core/gpu.h"
#include "ops/cuda/bulk_copy.cuh"
#include "ops/cuda/compute_math.cuh"
#include "ops/cuda/cross_entropy.h"
#include "ops/cuda/index_check.cuh"
#include "ops/cuda/online_softmax.cuh"
#include "ops/cuda/row_groups.cuh"

namespace precis::ops::cuda {

using namespace precis::cuda;  // the device toolkit (core/cuda/)

namespace {

constexpr float kLog2e = 1.4426950408889634f;

// 2^y for the kernels' exp(x) = 2^(x log2 e): exp2f (subnormal results kept, three instructions
// beside the ex2), or with kFast exp2_fast (the ex2 alone; results below 2^-126 flush to 0,
// which no probability beside the row's largest, 1, nor a 16-bit gradient notices).
template <bool kFast>
__device__ __forceinline__ float exp2_of(float y) {
  if constexpr (kFast)
    return exp2_fast(y);
  else
    return exp2f(y);
}

// Folds a pack of W values into the running (max m, sum s = sum exp(x - m)): the pack's max
// first, so that the sum is rescaled once per pack, not per value, and exp(y) = exp2(y log2 e)
// (one multiply and one ex2 per value: the f32 forward was bound by the per-value exp and
// branch of max_sum_add as much as by memory). -inf values add 0; NaN makes the sum NaN.
template <int W, bool kFastExp = false, typename T>
__device__ __forceinline__ void max_sum_add_pack(Pair<float>& ms, const Pack<T, W>& v) {
  float x[W];
  float pack_max = -std::numeric_limits<float>::infinity();
#pragma unroll
  for (int k = 0; k < W; ++k) {
    x[k] = convert_to<float>(v.v[k]);
    pack_max = fmaxf(pack_max, x[k]);
  }
  if (pack_max == -std::numeric_limits<float>::infinity()) {
#pragma unroll
    for (int k = 0; k < W; ++k)
      if (x[k] != x[k]) ms.second = x[k];  // a NaN beside -infs still makes the sum NaN
    return;
  }
  const float m = fmaxf(ms.first, pack_max);
  float s = ms.second * exp2_of<kFastExp>((ms.first - m) * kLog2e);
#pragma unroll
  for (int k = 0; k < W; ++k) s += exp2_of<kFastExp>((x[k] - m) * kLog2e);
  ms = {m, s};
}

// (max, sum) of an f32-computed row with kUnroll packs loaded before any is folded in, so that
// each thread keeps 16 * kUnroll bytes in flight; unaligned head and tail values one by one.
template <int kThreads, int kPack, typename T>
__device__ __forceinline__ void max_sum_of_row(const T* row, int64_t n, Pair<float>& ms) {
  constexpr int kUnroll = 4;
  const int tid = threadIdx.x;
  const int64_t misaligned = static_cast<int64_t>(reinterpret_cast<uintptr_t>(row) / sizeof(T) % kPack);
  const int64_t head = misaligned == 0 ? 0 : std::min<int64_t>(n, kPack - misaligned);
  const int64_t packs = (n - head) / kPack, tail = head + packs * kPack;
  if (tid < head) max_sum_add(ms, convert_to<float>(row[tid]));
  const T* body = row + head;
  int64_t p = tid;
  for (; p + (kUnroll - 1) * kThreads < packs; p += kUnroll * kThreads) {
    Pack<T, kPack> v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) v[u] = load_pack<kPack>(body + (p + u * kThreads) * kPack);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) max_sum_add_pack(ms, v[u]);
  }
  for (; p < packs; p += kThreads) max_sum_add_pack(ms, load_pack<kPack>(body + p * kPack));
  for (int64_t i = tail + tid; i < n; i += kThreads) max_sum_add(ms, convert_to<float>(row[i]));
}

// Bytes: the logits read once (and the target's logit again), per row the target read
// and 2 statistics and one f64 loss written.
template <int kThreads, int kPack, typename T, typename Target, typename A = compute_t<T>>
__global__ void PRECIS_ROW_LAUNCH_BOUNDS(kThreads)
    cross_entropy_forward_kernel(const T* logits, const Target* targets, int64_t ignore_index, A* stats, double* losses,
                                 unsigned long long* bad, int64_t rows, int64_t C, int64_t ld) {
  precis::cuda::wait_for_previous_grid();
  precis::cuda::allow_next_grid_to_start();
  const int64_t row = row_index();
  if (row >= rows) return;
  const int64_t t = static_cast<int64_t>(targets[row]);
  const bool ignored = t == ignore_index, valid = t >= 0 && t < C;
  if (ignored || !valid) {
    if (threadIdx.x == 0) {
      if (!ignored) flag_bad_position(bad, row);
      stats[2 * row] = stats[2 * row + 1] = A(0);
      losses[row] = ignored ? 0.0 : std::numeric_limits<double>::quiet_NaN();
    }
    return;
  }
  const T* xr = logits + row * ld;
  Pair<A> ms = max_sum_identity<A>();
  if constexpr (std::is_same_v<A, float> && kPack > 1) {
    max_sum_of_row<kThreads, kPack>(xr, C, ms);
  } else {
    for_each_in_row<kPack>(xr, C, threadIdx.x, kThreads, [&](int64_t i, auto width) {
      constexpr int W = decltype(width)::value;
      const Pack<T, W> v = load_pack<W>(xr + i);
#pragma unroll
      for (int k = 0; k < W; ++k) max_sum_add(ms, convert_to<A>(v.v[k]));
    });
  }
  ms = row_all_reduce<kThreads>(ms, MaxSumOp{});
  if (threadIdx.x == 0) {
    const A log_sum = ::log(ms.second);
    stats[2 * row] = ms.first;
    stats[2 * row + 1] = log_sum;
    losses[row] = static_cast<double>(ms.first - convert_to<A>(xr[t])) + static_cast<double>(log_sum);
  }
}

// loss = sum of the non-ignored rows' losses / their number, in f64, by one block: each
// thread adds every blockDim-th row in order, then a fixed-order block reduction.
// Bytes: 8 + sizeof(Target) per row read, two scalars written.
template <typename Target, typename A>
__global__ void __launch_bounds__(1024)
    cross_entropy_mean_kernel(const double* losses, const Target* targets, int64_t ignore_index, int64_t rows, A* loss,
                              int64_t* valid_count) {
  precis::cuda::wait_for_previous_grid();
  precis::cuda::allow_next_grid_to_start();
  Pair<double> sum_count{0.0, 0.0};  // the count is exact in a double up to 2^53 rows
  for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) {
    if (static_cast<int64_t>(targets[r]) == ignore_index) continue;
    sum_count.first += losses[r];
    sum_count.second += 1.0;
  }
  sum_count = block_all_reduce(sum_count, SumOp{});
  if (threadIdx.x == 0) {
    *valid_count = static_cast<int64_t>(sum_count.second);
    *loss = static_cast<A>(sum_count.first / sum_count.second);  // 0 / 0 = NaN when every target is ignored
  }
}

// Bytes: the logits' C columns read once, dlogits' width columns written once, per row a
// target and two statistics. A pack that straddles C (padded rows only, where the logits
// rows hold width >= C values too) loads past C but uses only the values before it.
template <int kThreads, int kPack, typename T, typename Target, typename A = compute_t<T>>
__global__ void PRECIS_ROW_LAUNCH_BOUNDS(kThreads)
    cross_entropy_backward_kernel(const T* logits, const Target* targets, int64_t ignore_index, const A* stats,
                                  const int64_t* valid_count, const A* grad, T* dlogits, int64_t rows, int64_t C,
                                  int64_t ld, int64_t width) {
  precis::cuda::wait_for_previous_grid();
  precis::cuda::allow_next_grid_to_start();
  const int64_t row = row_index();
  if (row >= rows) return;
  const T* xr = logits + row * ld;
  T* dr = dlogits + row * width;
  const int64_t t = static_cast<int64_t>(targets[row]);
  if (t == ignore_index) {
    for_each_in_row<kPack>(dr, width, threadIdx.x, kThreads, [&](int64_t i, auto pack) {
      constexpr int W = decltype(pack)::value;
      Pack<T, W> zero;
#pragma unroll
      for (int k = 0; k < W; ++k) zero.v[k] = convert_to<T>(A(0));
      store_pack<W>(dr + i, zero);
    });
    return;
  }
  const A m = stats[2 * row], log_sum = stats[2 * row + 1];
  const A scale = static_cast<A>(static_cast<double>(*grad) / static_cast<double>(*valid_count));
  for_each_in_row<kPack>(dr, width, threadIdx.x, kThreads, [&](int64_t i, auto pack) {
    constexpr int W = decltype(pack)::value;
    Pack<T, W> out;
    if (i < C) {
      const Pack<T, W> v = load_pack<W>(xr + i);
#pragma unroll
      for (int k = 0; k < W; ++k) {
        const A p = ::exp((convert_to<A>(v.v[k]) - m) - log_sum);
        out.v[k] = convert_to<T>(i + k >= C ? A(0) : (i + k == t ? p - A(1) : p) * scale);
      }
    } else {
#pragma unroll
      for (int k = 0; k < W; ++k) out.v[k] = convert_to<T>(A(0));
    }
    store_pack<W>(dr + i, out);
  });
}

// The probability of logit x in a row of statistics (m, log s), neg_log2_sum = -log(s) log2(e):
// exp((x - m) - log s) = exp2((x - m) log2(e) - log2(s)), a subtraction, a multiply-add and one
// ex2 (x - m first, so that large logits lose nothing).
template <bool kFastExp = false>
__device__ __forceinline__ float probability(float x, float m, float neg_log2_sum) {
  return exp2_of<kFastExp>(fmaf(x - m, kLog2e, neg_log2_sum));
}

// One pack of a row's gradient, columns col.. col + kPack - 1: scale (exp((x_j - m) - log s)
// - [j == t]) for j < C, 0 in the padding from C on.
template <bool kFastExp = false, typename T, int kPack>
__device__ __forceinline__ Pack<T, kPack> gradient_pack(const Pack<T, kPack>& v, int64_t col, int64_t C, int64_t t,
                                                        float m, float neg_log2_sum, float scale) {
  Pack<T, kPack> out;
#pragma unroll
  for (int k = 0; k < kPack; ++k) {
    const int64_t j = col + k;
    const float prob = probability<kFastExp>(convert_to<float>(v.v[k]), m, neg_log2_sum);
    out.v[k] = convert_to<T>(j >= C ? 0.0f : (j == t ? prob - 1.0f : prob) * scale);
  }
  return out;
}

// cross_entropy_backward_kernel's backward over dlogits as one flat array of packs of kPack
// elements (rows of `width` elements, logits rows `ld` apart, both multiples of kPack, 16-byte
// aligned), for f16/bf16/f32 logits, each pack by gradient_pack. Each thread loads kUnroll
// packs a block apart before it computes any, so that 16 * kUnroll bytes per thread are in
// flight. Index is uint32_t when the packs fit. Bytes as the row kernel's (the logits' columns
// read once, dlogits written once).
constexpr int kFlatThreads = 256, kFlatUnroll = 4;
template <int kPack, typename Index, typename T, typename Target>
__global__ void __launch_bounds__(kFlatThreads)
    cross_entropy_backward_flat_kernel(const T* logits, const Target* targets, int64_t ignore_index, const float* stats,
                                       const int64_t* valid_count, const float* grad, T* dlogits, Index rows, Index C,
                                       Index ld, Index width) {
  precis::cuda::wait_for_previous_grid();
  precis::cuda::allow_next_grid_to_start();
  const Index packs_per_row = width / kPack, total = rows * packs_per_row;
  const float scale = static_cast<float>(static_cast<double>(*grad) / static_cast<double>(*valid_count));
  const Index stride = static_cast<Index>(gridDim.x) * kFlatThreads * kFlatUnroll;
  for (Index base = static_cast<Index>(blockIdx.x) * kFlatThreads * kFlatUnroll + threadIdx.x; base < total;
       base += stride) {
    Pack<T, kPack> in[kFlatUnroll];
#pragma unroll
    for (int u = 0; u < kFlatUnroll; ++u) {
      const Index p = base + u * kFlatThreads;
      if (p >= total) break;
      const Index row = p / packs_per_row, col = (p - row * packs_per_row) * kPack;
      if (col < C) in[u] = load_pack<kPack>(logits + row * ld + col);
    }
#pragma unroll
    for (int u = 0; u < kFlatUnroll; ++u) {
      const Index p = base + u * kFlatThreads;
      if (p >= total) break;
      const Index row = p / packs_per_row, col = (p - row * packs_per_row) * kPack;
      const int64_t t = static_cast<int64_t>(targets[row]);
      Pack<T, kPack> out;
      if (t == ignore_index || col >= C) {
#pragma unroll
        for (int k = 0; k < kPack; ++k) out.v[k] = convert_to<T>(0.0f);
      } else {
        out = gradient_pack(in[u], static_cast<int64_t>(col), static_cast<int64_t>(C), t, stats[2 * row],
                            -stats[2 * row + 1] * kLog2e, scale);
      }
      store_pack<kPack>(dlogits + row * width + col, out);
    }
  }
}

// Launches the flat kernel when the layout allows it; false otherwise.
template <typename T, typename Target>
bool launch_backward_flat(const T* xp, const Target* tp, int64_t ignore_index, const float* stats,
                          const int64_t* valid_count, const float* grad, T* dp, int64_t rows, int64_t C, int64_t ld,
                          int64_t width, cudaStream_t stream) {
  constexpr int kPack = Packed128<T>::size;
  if (!aligned16(xp) || !aligned16(dp) || ld % kPack != 0 || width % kPack != 0 || ld < width) return false;
  const int64_t total = rows * (width / kPack);
  const int64_t per_block = int64_t{kFlatThreads} * kFlatUnroll;
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((total + per_block - 1) / per_block, 132 * 64));
  const bool narrow = rows * ld < (int64_t{1} << 31) && total < (int64_t{1} << 31);
  if (narrow) {
    precis::cuda::launch(cross_entropy_backward_flat_kernel<kPack, uint32_t, T, Target>, blocks, kFlatThreads, 0,
                         stream, xp, tp, ignore_index, stats, valid_count, grad, dp, static_cast<uint32_t>(rows),
                         static_cast<uint32_t>(C), static_cast<uint32_t>(ld), static_cast<uint32_t>(width));
  } else {
    precis::cuda::launch(cross_entropy_backward_flat_kernel<kPack, int64_t, T, Target>, blocks, kFlatThreads, 0, stream,
                         xp, tp, ignore_index, stats, valid_count, grad, dp, rows, C, ld, width);
  }
  return true;
}

// ---- the fused classifier: loss and gradient in one pass over the logits

// Before the fused kernel: the number of rows whose target is not ignore_index (each row's
// gradient is divided by it, so it must be known before any is written), and the target
// check. One block; integer counts, so the same on every run.
// Bytes: the targets read once.
template <typename Target>
__global__ void __launch_bounds__(1024)
    cross_entropy_count_kernel(const Target* targets, int64_t ignore_index, int64_t rows, int64_t C,
                               int64_t* valid_count, unsigned long long* bad) {
  precis::cuda::wait_for_previous_grid();
  precis::cuda::allow_next_grid_to_start();
  unsigned long long count = 0;
  for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) {
    const int64_t t = static_cast<int64_t>(targets[r]);
    if (t == ignore_index) continue;
    if (t < 0 || t >= C) flag_bad_position(bad, r);
    ++count;
  }
  count = block_all_reduce(count, SumOp{});
  if (threadIdx.x == 0) *valid_count = static_cast<int64_t>(count);
}

// One row's gradient from its statistics, dr[j] = scale (exp((x_j - m) - log s) - [j == t])
// for j < C and 0 in the padding [C, width), over packs of kPack (rows 16-byte aligned,
// width a multiple of kPack, logits rows holding >= width values), kUnroll packs loaded
// before any is written. dr may be xr itself: each pack is read before the same thread
// writes it.
template <int kThreads, int kPack, typename T>
__device__ __forceinline__ void write_row_gradient(const T* xr, T* dr, int64_t C, int64_t width, int64_t t, float m,
                                                   float log_sum, float scale) {
  constexpr int kUnroll = 4;
  const float neg_log2_sum = -log_sum * kLog2e;
  const int64_t packs = width / kPack;
  auto gradient_of = [&](const Pack<T, kPack>& v, int64_t col) {
    return gradient_pack(v, col, C, t, m, neg_log2_sum, scale);
  };
  int64_t p = threadIdx.x;
  for (; p + (kUnroll - 1) * kThreads < packs; p += kUnroll * kThreads) {
    Pack<T, kPack> v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) v[u] = load_pack<kPack>(xr + (p + u * kThreads) * kPack);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t col = (p + u * kThreads) * kPack;
      store_pack<kPack>(dr + col, gradient_of(v[u], col));
    }
  }
  for (; p < packs; p += kThreads)
    store_pack<kPack>(dr + p * kPack, gradient_of(load_pack<kPack>(xr + p * kPack), p * kPack));
}

// A fused kernel's row target t, or -1 where the row has none: t ignored (loss 0) or bad (loss
// NaN; the count kernel flagged it), whose gradient is then written here as zeros, padding
// included. Such a row is not read.
template <int kThreads, int kPack, typename T>
__device__ __forceinline__ int64_t row_target(int64_t t, int64_t ignore_index, int64_t C, T* dr, int64_t width,
                                              double* loss) {
  if (t != ignore_index && t >= 0 && t < C) return t;
  Pack<T, kPack> zero;
#pragma unroll
  for (int k = 0; k < kPack; ++k) zero.v[k] = convert_to<T>(0.0f);
  for (int64_t p = threadIdx.x; p < width / kPack; p += kThreads) store_pack<kPack>(dr + p * kPack, zero);
  if (threadIdx.x == 0) *loss = t == ignore_index ? 0.0 : std::numeric_limits<double>::quiet_NaN();
  return -1;
}

// Forward and backward of a row in one kernel (llm.c's fused classifier): pass 1 reads the
// row for (m, s) and the loss, pass 2 reads it again (from L2: the row was just read, and
// the rows in flight, ~2 per SM, fit in it) and writes the gradient, which the classifier's
// backward needs instead of the logits. scale = *grad_factor / *valid_count: the upstream
// gradient of the loss (loss scale / micro-batches) is known before the forward runs.
// Bytes: the logits read once from memory, the gradient written once (over the logits
// when dlogits == logits); apart, the forward and the backward read the logits twice.
template <int kThreads, int kPack, typename T, typename Target>
__global__ void PRECIS_ROW_LAUNCH_BOUNDS(kThreads)
    cross_entropy_fused_kernel(const T* logits, const Target* targets, int64_t ignore_index, const int64_t* valid_count,
                               const float* grad_factor, double* losses, T* dlogits, int64_t rows, int64_t C,
                               int64_t ld, int64_t width) {
  precis::cuda::wait_for_previous_grid();
  precis::cuda::allow_next_grid_to_start();
  const int64_t row = row_index();
  if (row >= rows) return;
  const T* xr = logits + row * ld;
  T* dr = dlogits + row * width;
  const int64_t t =
      row_target<kThreads, kPack>(static_cast<int64_t>(targets[row]), ignore_index, C, dr, width, losses + row);
  if (t < 0) return;
  Pair<float> ms = max_sum_identity<float>();
  max_sum_of_row<kThreads, kPack>(xr, C, ms);
  const float x_t = threadIdx.x == 0 ? convert_to<float>(xr[t]) : 0.0f;  // read before pass 2 may overwrite it
  if constexpr (kThreads == 32) __syncwarp();  // (a block-wide reduction is a barrier already)
  ms = row_all_reduce<kThreads>(ms, MaxSumOp{});
  const float log_sum = ::logf(ms.second);
  if (threadIdx.x == 0) losses[row] = static_cast<double>(ms.first - x_t) + static_cast<double>(log_sum);
  const float scale = static_cast<float>(static_cast<double>(*grad_factor) / static_cast<double>(*valid_count));
  write_row_gradient<kThreads, kPack>(xr, dr, C, width, t, ms.first, log_sum, scale);
}

// The fused kernel with the row staged in shared memory: pass 1 reads the row from memory once,
// keeps it in shared memory and folds its first C values into (m, s); pass 2 takes the row from
// shared memory and writes the gradient. Why: GPT-2's rows (50304 bf16 values, 98 KiB) at 2-4
// rows in flight per SM are ~50 MB across an H100, L2's size, so the other kernel's pass 2 reads
// much of its row from memory again (GPT-2's bytes: 3.3 GB, the logits read once and the
// gradient written once; bench/NOTES.md has the measured times: the re-read was a small part
// of the gap, and the two exponentials per value, ~1.6G MUFU operations a step, are the next
// suspect). Rows of width * sizeof(T) <=
// kMaxStagedRowBytes, 2 blocks (rows) an SM. Each thread reads back only the packs it staged,
// so pass 2 needs no barrier beyond the reduction's. x_t comes from the staged row: dlogits may
// be the logits' own memory, and pass 2 overwrites it.
constexpr int64_t kMaxStagedRowBytes = 110 * 1024;
template <int kThreads, int kPack, typename T, typename Target>
__global__ void PRECIS_ROW_LAUNCH_BOUNDS(kThreads)
    cross_entropy_fused_staged_kernel(const T* logits, const Target* targets, int64_t ignore_index,
                                      const int64_t* valid_count, const float* grad_factor, double* losses, T* dlogits,
                                      int64_t rows, int64_t C, int64_t ld, int64_t width) {
  precis::cuda::wait_for_previous_grid();
  precis::cuda::allow_next_grid_to_start();
  static_assert(kThreads > 32, "a block per row");
  extern __shared__ __align__(16) unsigned char staged_bytes[];
  Pack<T, kPack>* staged = reinterpret_cast<Pack<T, kPack>*>(staged_bytes);
  constexpr int kUnroll = 4;
  const int64_t row = blockIdx.x;
  if (row >= rows) return;
  const T* xr = logits + row * ld;
  T* dr = dlogits + row * width;
  const int64_t t =
      row_target<kThreads, kPack>(static_cast<int64_t>(targets[row]), ignore_index, C, dr, width, losses + row);
  if (t < 0) return;
  const int64_t packs = width / kPack;
  // Pass 1: kUnroll packs in flight a thread; the pack that straddles C folds only its values before C.
  Pair<float> ms = max_sum_identity<float>();
  auto fold = [&](const Pack<T, kPack>& v, int64_t col) {
    if (col + kPack <= C) {
      max_sum_add_pack(ms, v);
    } else {
#pragma unroll
      for (int k = 0; k < kPack; ++k)
        if (col + k < C) max_sum_add(ms, convert_to<float>(v.v[k]));
    }
  };
  int64_t p = threadIdx.x;
  for (; p + (kUnroll - 1) * kThreads < packs; p += kUnroll * kThreads) {
    Pack<T, kPack> v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) v[u] = load_pack<kPack>(xr + (p + u * kThreads) * kPack);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      staged[p + u * kThreads] = v[u];
      fold(v[u], (p + u * kThreads) * kPack);
    }
  }
  for (; p < packs; p += kThreads) {
    const Pack<T, kPack> v = load_pack<kPack>(xr + p * kPack);
    staged[p] = v;
    fold(v, p * kPack);
  }
  ms = row_all_reduce<kThreads>(ms, MaxSumOp{});  // a barrier: the staged row is complete
  const float log_sum = ::logf(ms.second);
  if (threadIdx.x == 0) {
    const float x_t = convert_to<float>(reinterpret_cast<const T*>(staged_bytes)[t]);
    losses[row] = static_cast<double>(ms.first - x_t) + static_cast<double>(log_sum);
  }
  const float scale = static_cast<float>(static_cast<double>(*grad_factor) / static_cast<double>(*valid_count));
  // Pass 2: dr[j] = scale (exp((x_j - m) - log s) - [j == t]) for j < C, 0 in the padding.
  const float neg_log2_sum = -log_sum * kLog2e;
  for (int64_t q = threadIdx.x; q < packs; q += kThreads)
    store_pack<kPack>(dr + q * kPack, gradient_pack(staged[q], q * kPack, C, t, ms.first, neg_log2_sum, scale));
}

// The staged kernel with the row brought in by the copy engine (sm_90; ops/cuda/bulk_copy.cuh),
// for rows of width * sizeof(T) <= kMaxStagedRowBytes, 512 threads a row, 2 rows an SM:
//   load:   one thread asks for the row's packs that hold its C real columns, ceil(C / kPack),
//           as chunks of 512 packs (8 KiB), each reporting to its own mbarrier: the whole row
//           is in flight at once, and no thread holds a load. The ignored row is not read.
//   pass 1: as each chunk lands, thread i folds its pack i of the chunk from shared memory into
//           its (m, s) (max_sum_add_pack: one ex2 a value and one a pack; the pack that
//           straddles C folds only its values before C); then (m, s) over the row (a block
//           reduction) and loss = (m - x_t) + log s, x_t from the staged row.
//   pass 2: dr[j] = scale (p_j - [j == t]), p_j = exp((x_j - m) - log s), for j < C from the
//           staged row, 0 in the padding [C, width); scale = *grad_factor / *valid_count.
//           A pack wholly before C that does not hold the target writes scale p_j alone (the
//           same arithmetic as gradient_pack's, without its per-value column tests).
// Against cross_entropy_fused_staged_kernel, whose threads load 4 packs at a time and wait for
// them before they fold and load more: the row's bytes are all requested at once (the loads
// no longer wait on one another), and per value one ex2 instruction instead of exp2f's four,
// 32-bit column arithmetic, and 16-byte shared-memory reads in pass 2 (that kernel read its
// staged packs element by element). Bytes the same: the row's C columns read once, width
// written once (over the logits when dlogits == logits: each block reads and writes only its
// row, and its row is in shared memory before any of it is written). With kOneExp the passes are
// passes_with_one_exponential's (an experiment).
constexpr int kBulkThreads = 512;
constexpr int kBulkChunkPacks = kBulkThreads;  // 16-byte packs a chunk: one a thread
constexpr int kBulkMaxChunks = static_cast<int>((kMaxStagedRowBytes / 16 + kBulkChunkPacks - 1) / kBulkChunkPacks);

// The load of the sm_90 long-row kernels: thread 0 asks the copy engine for the row's first
// `loaded` packs into staged_bytes, as chunks of kBulkChunkPacks packs, chunk c reporting to
// landed[c]. Every thread calls it (its barrier orders the mbarriers' initialisation before any
// wait on them); returns the number of chunks.
template <typename T>
__device__ __forceinline__ int copy_row_to_shared(unsigned char* staged_bytes, const T* row, int loaded,
                                                  uint64_t* landed) {
  constexpr int kPack = Packed128<T>::size;
  const int chunks = (loaded + kBulkChunkPacks - 1) / kBulkChunkPacks;
  if (threadIdx.x == 0) {
    for (int c = 0; c < chunks; ++c) mbarrier_init(&landed[c], 1);
    fence_mbarrier_init();
    for (int c = 0; c < chunks; ++c) {
      const int first = c * kBulkChunkPacks;
      const uint32_t bytes = static_cast<uint32_t>(min(kBulkChunkPacks, loaded - first)) * 16u;
      mbarrier_arrive_expect_bytes(&landed[c], bytes);
      bulk_copy_to_shared(staged_bytes + first * 16, row + first * kPack, bytes, &landed[c]);
    }
  }
  __syncthreads();
  return chunks;
}

// The bulk kernel's passes with one exponential a logit instead of two (kOneExp; an experiment,
// off by default: set_one_exp_classifier). On an H200 the two passes' ~2.1 ex2 a logit (pass 1's
// running sum and its rescales, pass 2's probability) are ~6.7K cycles of the special-function
// unit per row and SM against ~5.5 us of the row's memory time, and two rows an SM overlap them
// only in part (bench/NOTES.md, the twenty-third session). Here, once the row is in flight:
//   pass 1: as each chunk lands, thread i folds the max of its pack i of the chunk (no
//           exponential); then m over the row (a block reduction).
//   pass 2: e_j = exp(x_j - m) (one ex2), s += e_j, and e_j written over x_j in the staged row,
//           rounded to T; then s over the row; loss = (m - x_t) + log s, x_t read before pass 2.
//   pass 3: dr[j] = scale e_j / s for j < C, j != t, from the staged e_j (no exponential);
//           dr[t] = scale (exp((x_t - m) - log s) - 1) from x_t itself; 0 in the padding.
// Every thread reads back only the packs it wrote in pass 2, and pass 3 follows the sum's block
// reduction, a barrier. The rounding differs from the bulk kernel's: e_j is rounded to T before
// it is scaled, and the product again (a unit or two in the last place of T apart, not its bits).
struct MaxOfFloats {
  __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
template <typename T>
__device__ __forceinline__ void passes_with_one_exponential(T* staged, uint64_t* chunk_landed, int chunks, int loaded,
                                                            int packs, int n, int t, T* dr, double* loss,
                                                            const int64_t* valid_count, const float* grad_factor) {
  constexpr int kPack = Packed128<T>::size;
  const int tid = threadIdx.x;
  // Pass 1: the row's max.
  float m = -std::numeric_limits<float>::infinity();
  for (int c = 0; c < chunks; ++c) {
    mbarrier_wait(&chunk_landed[c], 0);
    const int p = c * kBulkChunkPacks + tid;
    if (p >= loaded) continue;
    const Pack<T, kPack> v = load_pack<kPack>(staged + p * kPack);
    const bool whole = (p + 1) * kPack <= n;  // else the pack that straddles C: its values before C
#pragma unroll
    for (int k = 0; k < kPack; ++k)
      if (whole || p * kPack + k < n) m = fmaxf(m, convert_to<float>(v.v[k]));
  }
  m = block_all_reduce(m, MaxOfFloats{});
  const float x_t = convert_to<float>(staged[t]);  // before pass 2 overwrites it
  __syncthreads();                                 // every thread has read x_t

  // Pass 2: e_j = exp(x_j - m) over the thread's packs, kept in the staged row; s = sum e_j.
  const float neg_m_log2e = -m * kLog2e;
  float s = 0.0f;
  for (int p = tid; p < loaded; p += kBulkThreads) {
    Pack<T, kPack> v = load_pack<kPack>(staged + p * kPack);
    const bool whole = (p + 1) * kPack <= n;
#pragma unroll
    for (int k = 0; k < kPack; ++k) {
      const float e =
          whole || p * kPack + k < n ? exp2_fast(fmaf(convert_to<float>(v.v[k]), kLog2e, neg_m_log2e)) : 0.0f;
      s += e;
      v.v[k] = convert_to<T>(e);
    }
    store_pack<kPack>(staged + p * kPack, v);
  }
  s = block_all_reduce(s, SumOp{});
  const float log_sum = ::logf(s);
  if (tid == 0) *loss = static_cast<double>(m - x_t) + static_cast<double>(log_sum);

  // Pass 3.
  const float scale = static_cast<float>(static_cast<double>(*grad_factor) / static_cast<double>(*valid_count));
  const float scale_over_sum = scale / s;
  T* out_at = dr + tid * kPack;
  for (int q = tid; q < packs; q += kBulkThreads, out_at += kBulkThreads * kPack) {
    const int col = q * kPack;
    Pack<T, kPack> out;
    if (col + kPack <= n && (t < col || t >= col + kPack)) {  // the common pack: no column tests
      const Pack<T, kPack> e = load_pack<kPack>(staged + col);
#pragma unroll
      for (int k = 0; k < kPack; ++k) out.v[k] = convert_to<T>(convert_to<float>(e.v[k]) * scale_over_sum);
    } else if (q < loaded) {
      const Pack<T, kPack> e = load_pack<kPack>(staged + col);
#pragma unroll
      for (int k = 0; k < kPack; ++k) {
        const int j = col + k;
        float g = j < n ? convert_to<float>(e.v[k]) * scale_over_sum : 0.0f;
        if (j == t) g = (probability<true>(x_t, m, -log_sum * kLog2e) - 1.0f) * scale;
        out.v[k] = convert_to<T>(g);
      }
    } else {
#pragma unroll
      for (int k = 0; k < kPack; ++k) out.v[k] = convert_to<T>(0.0f);
    }
    store_pack<kPack>(out_at, out);
  }
}

template <bool kOneExp, typename T, typename Target>
__global__ void __launch_bounds__(kBulkThreads, 2)
    cross_entropy_fused_bulk_kernel(const T* logits, const Target* targets, int64_t ignore_index,
                                    const int64_t* valid_count, const float* grad_factor, double* losses, T* dlogits,
                                    int64_t rows, int64_t C, int64_t ld, int64_t width) {
  precis::cuda::wait_for_previous_grid();
  precis::cuda::allow_next_grid_to_start();
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr int kPack = Packed128<T>::size;
  __shared__ uint64_t chunk_landed[kBulkMaxChunks];
  extern __shared__ __align__(16) unsigned char staged_bytes[];
  T* staged = reinterpret_cast<T*>(staged_bytes);
  const int64_t row = blockIdx.x;
  if (row >= rows) return;
  const T* xr = logits + row * ld;
  T* dr = dlogits + row * width;
  const int64_t target =
      row_target<kBulkThreads, kPack>(static_cast<int64_t>(targets[row]), ignore_index, C, dr, width, losses + row);
  if (target < 0) return;
  // Row lengths fit 32 bits here (at most kMaxStagedRowBytes / sizeof(T) values).
  const int tid = threadIdx.x, n = static_cast<int>(C), t = static_cast<int>(target);
  const int packs = static_cast<int>(width / kPack), loaded = (n + kPack - 1) / kPack;
  const int chunks = copy_row_to_shared(staged_bytes, xr, loaded, chunk_landed);
  if constexpr (kOneExp) {
    passes_with_one_exponential(staged, chunk_landed, chunks, loaded, packs, n, t, dr, losses + row, valid_count,
                                grad_factor);
    return;
  }

  // Pass 1.
  Pair<float> ms = max_sum_identity<float>();
  for (int c = 0; c < chunks; ++c) {
    mbarrier_wait(&chunk_landed[c], 0);
    const int p = c * kBulkChunkPacks + tid;
    if (p >= loaded) continue;
    const Pack<T, kPack> v = load_pack<kPack>(staged + p * kPack);
    if ((p + 1) * kPack <= n) {
      max_sum_add_pack<kPack, true>(ms, v);
    } else {
#pragma unroll
      for (int k = 0; k < kPack; ++k)
        if (p * kPack + k < n) max_sum_add(ms, convert_to<float>(v.v[k]));
    }
  }
  ms = row_all_reduce<kBulkThreads>(ms, MaxSumOp{});
  const float m = ms.first, log_sum = ::logf(ms.second);
  if (tid == 0) losses[row] = static_cast<double>(m - convert_to<float>(staged[t])) + static_cast<double>(log_sum);

  // Pass 2.
  const float scale = static_cast<float>(static_cast<double>(*grad_factor) / static_cast<double>(*valid_count));
  const float neg_log2_sum = -log_sum * kLog2e;
  T* out_at = dr + tid * kPack;
  for (int q = tid; q < packs; q += kBulkThreads, out_at += kBulkThreads * kPack) {
    const int col = q * kPack;
    Pack<T, kPack> out;
    if (col + kPack <= n && (t < col || t >= col + kPack)) {
      const Pack<T, kPack> v = load_pack<kPack>(staged + col);
#pragma unroll
      for (int k = 0; k < kPack; ++k)
        out.v[k] = convert_to<T>(probability<true>(convert_to<float>(v.v[k]), m, neg_log2_sum) * scale);
    } else if (q < loaded) {
      out = gradient_pack<true>(load_pack<kPack>(staged + col), col, n, t, m, neg_log2_sum, scale);
    } else {
#pragma unroll
      for (int k = 0; k < kPack; ++k) out.v[k] = convert_to<T>(0.0f);
    }
    store_pack<kPack>(out_at, out);
  }
#endif
}

}  // namespace

std::atomic<bool>& staged_classifier_forced() {
  static std::atomic<bool> forced{false};
  return forced;
}

namespace {
EnvSwitch g_one_exp_classifier("PRECIS_EXP_CE_ONE_EXP");
}  // namespace
void set_one_exp_classifier(bool on) { g_one_exp_classifier.set(on); }
bool one_exp_classifier() { return g_one_exp_classifier.on(); }

BadIndex cross_entropy_forward(const Tensor& logits, const Tensor& targets, int64_t ignore_index, const Tensor& stats,
                               const Tensor& loss, const Tensor& valid_count) {
  const char* op = "cross_entropy";
  const int64_t rows = targets.numel(), C = logits.shape().back(), ld = logits.strides()[0];
  cudaStream_t stream = stream_for(logits);
  Tensor losses = empty({rows}, DType::f64, logits.device());
  Tensor flag = empty({1}, DType::i64, logits.device());
  unsigned long long* bad = bad_position_flag(flag, stream, op);
  dispatch_floating(logits.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = compute_t<T>;
    dispatch_index(targets.dtype(), op, [&](auto target_tag) {
      using Target = typename decltype(target_tag)::type;
      const T* xp = static_cast<const T*>(logits.raw_data());
      const Target* tp = static_cast<const Target*>(targets.raw_data());
      if (rows > 0) {
        dispatch_row_threads(C, [&](auto threads) {
          constexpr int kThreads = decltype(threads)::value;
          const dim3 grid(row_grid<kThreads>(rows)), block = row_block<kThreads>();
          // Packs at any row alignment: one array is read, and for_each_in_row splits it at 16-byte boundaries.
          precis::cuda::launch(cross_entropy_forward_kernel<kThreads, Packed128<T>::size, T, Target>, grid, block, 0,
                               stream, xp, tp, ignore_index, static_cast<A*>(stats.raw_data()),
                               static_cast<double*>(losses.raw_data()), bad, rows, C, ld);
        });
        PRECIS_CUDA_CHECK_LAUNCH(op);
      }
      precis::cuda::launch(cross_entropy_mean_kernel<Target, A>, 1, 1024, 0, stream,
                           static_cast<const double*>(losses.raw_data()), tp, ignore_index, rows,
                           static_cast<A*>(loss.raw_data()), static_cast<int64_t*>(valid_count.raw_data()));
      PRECIS_CUDA_CHECK_LAUNCH(op);
    });
  });
  return read_bad_position(bad, targets, stream, op);
}

void cross_entropy_backward(const Tensor& logits, const Tensor& targets, int64_t ignore_index, const Tensor& stats,
                            const Tensor& valid_count, const Tensor& grad, const Tensor& dlogits) {
  const char* op = "cross_entropy backward";
  const int64_t rows = targets.numel(), C = logits.shape().back(), ld = logits.strides()[0];
  const int64_t width = dlogits.shape().back();
  if (rows == 0 || width == 0) return;
  cudaStream_t stream = stream_for(logits);
  dispatch_floating(logits.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = compute_t<T>;
    PRECIS_CHECK(grad.dtype() == dtype_of<A>::value && grad.numel() == 1, op, ": expected a ", dtype_of<A>::value,
                 " scalar gradient, got ", describe(grad));
    dispatch_index(targets.dtype(), op, [&](auto target_tag) {
      using Target = typename decltype(target_tag)::type;
      const T* xp = static_cast<const T*>(logits.raw_data());
      T* dp = static_cast<T*>(dlogits.raw_data());
      if constexpr (std::is_same_v<A, float>) {
        if (launch_backward_flat(xp, static_cast<const Target*>(targets.raw_data()), ignore_index,
                                 static_cast<const float*>(stats.raw_data()),
                                 static_cast<const int64_t*>(valid_count.raw_data()),
                                 static_cast<const float*>(grad.raw_data()), dp, rows, C, ld, width, stream))
          return;
      }
      // Packs need every logits row in the 16-byte phase of its dlogits row.
      const bool packed = same_phase16(xp, dp) && (ld - width) * static_cast<int64_t>(sizeof(T)) % 16 == 0;
      dispatch_row_threads(C, [&](auto threads) {
        constexpr int kThreads = decltype(threads)::value;
        const dim3 grid(row_grid<kThreads>(rows)), block = row_block<kThreads>();
        auto launch = [&](auto kernel) {
          precis::cuda::launch(kernel, grid, block, 0, stream, xp, static_cast<const Target*>(targets.raw_data()),
                               ignore_index, static_cast<const A*>(stats.raw_data()),
                               static_cast<const int64_t*>(valid_count.raw_data()),
                               static_cast<const A*>(grad.raw_data()), dp, rows, C, ld, width);
        };
        if (packed)
          launch(cross_entropy_backward_kernel<kThreads, Packed128<T>::size, T, Target>);
        else
          launch(cross_entropy_backward_kernel<kThreads, 1, T, Target>);
      });
    });
  });
  PRECIS_CUDA_CHECK_LAUNCH(op);
}

BadIndex cross_entropy_with_grad(const Tensor& logits, const Tensor& targets, int64_t ignore_index,
                                 const Tensor& grad_factor, const Tensor& loss, const Tensor& dlogits) {
  const char* op = "cross_entropy_with_grad";
  const int64_t rows = targets.numel(), C = logits.shape().back(), ld = logits.strides()[0];
  const int64_t width = dlogits.shape().back();
  const Device device = logits.device();
  cudaStream_t stream = stream_for(logits);
  Tensor valid_count = empty({}, DType::i64, device);
  bool fused = false;
  BadIndex bad_index;
  dispatch_floating(logits.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    constexpr int kPack = Packed128<T>::size;
    const T* xp = static_cast<const T*>(logits.raw_data());
    T* dp = static_cast<T*>(dlogits.raw_data());
    fused = std::is_same_v<compute_t<T>, float> && rows > 0 && aligned16(xp) && aligned16(dp) && ld % kPack == 0 &&
            width % kPack == 0 && ld >= width;
    if (!fused) return;
    PRECIS_CHECK(grad_factor.dtype() == DType::f32 && grad_factor.numel() == 1, op,
                 ": expected an f32 scalar gradient factor, got ", describe(grad_factor));
    Tensor losses = empty({rows}, DType::f64, device);
    Tensor flag = empty({1}, DType::i64, device);
    unsigned long long* bad = bad_position_flag(flag, stream, op);
    dispatch_index(targets.dtype(), op, [&](auto target_tag) {
      using Target = typename decltype(target_tag)::type;
      const Target* tp = static_cast<const Target*>(targets.raw_data());
      auto* count = static_cast<int64_t*>(valid_count.raw_data());
      precis::cuda::launch(cross_entropy_count_kernel<Target>, 1, 1024, 0, stream, tp, ignore_index, rows, C, count,
                           bad);
      PRECIS_CUDA_CHECK_LAUNCH(op);
      // Checked before anything is written, so that a bad target leaves the logits as they were.
      bad_index = read_bad_position(bad, targets, stream, op);
      if (bad_index.position >= 0) return;
      const float* factor = static_cast<const float*>(grad_factor.raw_data());
      double* row_losses = static_cast<double*>(losses.raw_data());
      const int64_t staged_bytes = width * static_cast<int64_t>(sizeof(T));
      const bool staged = C > 16384 && staged_bytes <= kMaxStagedRowBytes;  // long rows: a block of 512 threads each
      if (staged && !staged_classifier_forced().load() && cuda_compute_capability(device.index) >= 90) {
        auto kernel = one_exp_classifier() ? cross_entropy_fused_bulk_kernel<true, T, Target>
                                           : cross_entropy_fused_bulk_kernel<false, T, Target>;
        PRECIS_CUDA_CHECK(
            cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int{kMaxStagedRowBytes}), op);
        // Two rows an SM need 2 x 110 KiB of the SM's memory as shared memory, not L1.
        PRECIS_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                               cudaSharedmemCarveoutMaxShared),
                          op);
        precis::cuda::launch(kernel, static_cast<unsigned>(rows), kBulkThreads, static_cast<size_t>(staged_bytes),
                             stream, xp, tp, ignore_index, count, factor, row_losses, dp, rows, C, ld, width);
      } else if (staged) {
        constexpr int kThreads = 512;
        auto kernel = cross_entropy_fused_staged_kernel<kThreads, kPack, T, Target>;
        PRECIS_CUDA_CHECK(
            cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int{kMaxStagedRowBytes}), op);
        precis::cuda::launch(kernel, static_cast<unsigned>(rows), kThreads, static_cast<size_t>(staged_bytes), stream,
                             xp, tp, ignore_index, count, factor, row_losses, dp, rows, C, ld, width);
      } else {
        dispatch_row_threads(C, [&](auto threads) {
          constexpr int kThreads = decltype(threads)::value;
          precis::cuda::launch(cross_entropy_fused_kernel<kThreads, kPack, T, Target>, row_grid<kThreads>(rows),
                               row_block<kThreads>(), 0, stream, xp, tp, ignore_index, count, factor, row_losses, dp,
                               rows, C, ld, width);
        });
      }
      PRECIS_CUDA_CHECK_LAUNCH(op);
      precis::cuda::launch(cross_entropy_mean_kernel<Target, float>, 1, 1024, 0, stream,
                           static_cast<const double*>(losses.raw_data()), tp, ignore_index, rows,
                           static_cast<float*>(loss.raw_data()), count);
      PRECIS_CUDA_CHECK_LAUNCH(op);
    });
  });
  if (fused) return bad_index;
  // Any other layout or dtype: the two passes (in place too: each pass reads an element
  // before the same thread writes it).
  Tensor stats = empty({rows, 2}, loss.dtype(), device);
  bad_index = cross_entropy_forward(logits, targets, ignore_index, stats, loss, valid_count);
  if (bad_index.position >= 0) return bad_index;
  cross_entropy_backward(logits, targets, ignore_index, stats, valid_count, grad_factor, dlogits);
  return bad_index;
}

}  // namespace precis::ops::cuda
