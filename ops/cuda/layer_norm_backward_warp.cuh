// The layer norm backward for rows a warp holds (C <= 768, every row at a 16-byte pack
// boundary): stage 1 of ops/cuda/layer_norm.cu's backward for GPT-2's rows, included by it.
//
// A warp per row, as the held forward: each lane loads all its packs of x, g and g_sum of the
// row at once, the row's two sums are a warp shuffle (no block barrier per row), and the lane
// keeps its columns' dw, db (and the residual bias's gradient) sums in registers over all the
// warp's rows. A block is one SM's worth of warps and the grid one block per resident slot, so a
// block folds its warps' sums once, at the end, into one partial row per column sum: few partial
// rows for stage 2 (layer_norm_param_grads_kernel) to add.
#pragma once

#include <cstdint>
#include <type_traits>

#include "core/cuda/block_reduce.cuh"
#include "core/cuda/convert.cuh"
#include "core/cuda/launch.cuh"
#include "core/cuda/pack.cuh"

namespace precis::ops::cuda {

// The values of a row a lane holds: 8, 16 or 24 (rows of up to 256, 512, 768 values), in packs
// of 16 bytes of x's dtype. Lanes of 32 values (rows of 1024) spill with the residual bias's sums.
inline constexpr int kWarpBackwardMaxLaneValues = 24;
// The threads of a block: 12 warps of up to 168 registers a thread fill an SM's registers. At 128
// registers (16 warps) the kernels with the residual bias spill.
inline constexpr int kWarpBackwardThreads = 384;
// Static shared memory for folding the warps' column sums: a running total and warps' staged sums.
inline constexpr int kWarpFoldBytes = 48 * 1024;

// Hides the value of `pack` from the compiler (an empty asm that may change its words), so
// values computed from it before cannot stand in for the same values computed after: a row's
// packs stay in registers packed (4 a pack) between the two passes, instead of each pass-1
// conversion and xhat being kept, a register per value, for pass 2.
template <typename V, int W>
__device__ __forceinline__ void launder(precis::cuda::Pack<V, W>& pack) {
  static_assert(sizeof(pack) % 4 == 0, "a pack of 32-bit words");
  uint32_t* words = reinterpret_cast<uint32_t*>(&pack);
#pragma unroll
  for (int i = 0; i < static_cast<int>(sizeof(pack) / 4); ++i) asm volatile("" : "+r"(words[i]));
}

// Adds the column sums each lane of each warp holds (sums[v], v < kValues, the same v of every
// warp belonging to one column of one sum) over the block's warps, warp 0's first, then warp 1's,
// ..., and passes each total to write(v, lane, total). Warps stage their sums in shared memory a
// few at a time; every thread adds some of the (v, lane) values over the staged warps in warp
// order, so the order is fixed by the block shape. Every thread must call it.
template <int kValues, typename A, typename Write>
__device__ __forceinline__ void fold_warps(const A (&sums)[kValues], Write&& write) {
  constexpr int kWarpBytes = kValues * 32 * static_cast<int>(sizeof(A));
  constexpr int kStaged = kWarpFoldBytes / kWarpBytes - 1;  // warps staged at a time, beside the total
  static_assert(kStaged >= 1, "a warp's sums and the total fit in the fold's shared memory");
  __shared__ A staged[kStaged][kValues * 32];
  __shared__ A total[kValues * 32];
  const int lane = threadIdx.x, warp = threadIdx.y, warps = blockDim.y;
  const int tid = warp * 32 + lane, threads = warps * 32;
  for (int base = 0; base < warps; base += kStaged) {
    const int slots = warps - base < kStaged ? warps - base : kStaged;
    if (warp >= base && warp < base + slots) {
#pragma unroll
      for (int v = 0; v < kValues; ++v) staged[warp - base][v * 32 + lane] = sums[v];  // lane-fastest: no conflicts
    }
    __syncthreads();
    for (int j = tid; j < kValues * 32; j += threads) {
      A t = base == 0 ? A(0) : total[j];
      for (int s = 0; s < slots; ++s) t += staged[s][j];
      total[j] = t;
    }
    __syncthreads();  // staged is free for the next warps, total complete
  }
  for (int j = tid; j < kValues * 32; j += threads) write(j / 32, j % 32, total[j]);
}

// One row of stage 1 for lane `lane`: x_at(p), g_at(p) and g_sum_at(p) give the lane's p-th packs of x, g and g_sum
// (g_sum only when has_g_sum). With xhat = (x - mean) rstd and dxhat = g w (the CPU's math, ops/layer_norm.cpp):
//   dx  = rstd (dxhat - mean(dxhat) - xhat mean(dxhat xhat)) (+ g_sum, the sum's own gradient)
//   dw += g xhat,  db += g,  drb += dx   (per column: the lane's sums[s][p][k])
// Pass 1 sums dxhat and dxhat xhat in column order and over the warp (a shuffle butterfly);
// between() runs before pass 2, which writes dx (in T) and dr (in R) and adds the sums. The
// weight, in P (T or the statistics dtype A), is read per row (from L1). Every product and sum
// is spelled out (the _rn intrinsics, a product fused with the sum it feeds), so the compiler
// contracts nothing on its own: how the kernel rounds is written here, not left to the compiler.
template <int kLanePacks, int kPack, bool kResidualBias, typename T, typename R, typename P, typename A, typename XAt,
          typename GAt, typename SumAt, typename Between>
__device__ __forceinline__ void backward_warp_row(int64_t row, int64_t C, int lane, A mu, A rs, const P* weight,
                                                  bool has_g_sum, T* dx, R* dr, A* sums, XAt&& x_at, GAt&& g_at,
                                                  SumAt&& g_sum_at, Between&& between) {
  using namespace precis::cuda;
  static_assert(std::is_same_v<A, float>, "f32 statistics (f64 rows take another kernel)");
  auto column = [lane](int p) { return static_cast<int64_t>(p * 32 + lane) * kPack; };
  auto sum_at = [&](int s, int p, int k) -> A& { return sums[(s * kLanePacks + p) * kPack + k]; };
  // xhat = (x - mean) rstd
  auto normalized = [](A x, A mean, A rstd) { return __fmul_rn(__fsub_rn(x, mean), rstd); };
  Pair<A> row_sums{0, 0};  // sum dxhat, sum dxhat xhat
#pragma unroll
  for (int p = 0; p < kLanePacks; ++p) {
    if (column(p) >= C) continue;
    const Pack<P, kPack> w = load_pack<kPack>(weight + column(p));
    const auto xs = x_at(p);
    const auto gs = g_at(p);
#pragma unroll
    for (int k = 0; k < kPack; ++k) {
      const A xhat = normalized(convert_to<A>(xs.v[k]), mu, rs);
      const A dxhat = __fmul_rn(convert_to<A>(gs.v[k]), convert_to<A>(w.v[k]));
      row_sums.first = __fadd_rn(row_sums.first, dxhat);
      row_sums.second = __fmaf_rn(dxhat, xhat, row_sums.second);
    }
  }
  row_sums = warp_all_reduce(row_sums, SumOp{});
  between();
  const A mean_dxhat = row_sums.first / static_cast<A>(C), mean_dxhat_xhat = row_sums.second / static_cast<A>(C);
#pragma unroll
  for (int p = 0; p < kLanePacks; ++p) {
    const int64_t col = column(p);
    if (col >= C) continue;
    const Pack<P, kPack> w = load_pack<kPack>(weight + col);
    const auto xs = x_at(p);
    const auto gs = g_at(p);
    Pack<T, kPack> out;
    Pack<R, kPack> out_r;
#pragma unroll
    for (int k = 0; k < kPack; ++k) {
      const A xhat = normalized(convert_to<A>(xs.v[k]), mu, rs), gk = convert_to<A>(gs.v[k]);
      sum_at(0, p, k) = __fmaf_rn(gk, xhat, sum_at(0, p, k));
      sum_at(1, p, k) = __fadd_rn(sum_at(1, p, k), gk);
      // rs ((gk w - mean_dxhat) - xhat mean_dxhat_xhat), each product fused with its sum
      A d = __fmul_rn(rs, __fmaf_rn(-xhat, mean_dxhat_xhat, __fmaf_rn(gk, convert_to<A>(w.v[k]), -mean_dxhat)));
      if (has_g_sum) d = __fadd_rn(d, convert_to<A>(g_sum_at(p).v[k]));
      if constexpr (kResidualBias) sum_at(2, p, k) = __fadd_rn(sum_at(2, p, k), d);
      out.v[k] = convert_to<T>(d);
      out_r.v[k] = convert_to<R>(d);
    }
    if (dx) store_pack<kPack>(dx + row * C + col, out);
    if (dr) store_pack<kPack>(dr + row * C + col, out_r);
  }
}

// The block's end: its warps' column sums folded (fold_warps) into
// partial_dw, partial_db, partial_drb [gridDim.x, C] (null: not wanted), row blockIdx.x.
template <int kLanePacks, int kPack, int kSums, typename A>
__device__ __forceinline__ void write_warp_partials(const A (&sums)[kSums * kLanePacks * kPack], int64_t C,
                                                    A* partial_dw, A* partial_db, A* partial_drb) {
  if (!partial_dw && !partial_db && !partial_drb) return;  // the same for every thread of the grid
  fold_warps(sums, [&](int v, int owner, A total) {
    const int s = v / (kLanePacks * kPack), p = v / kPack % kLanePacks, k = v % kPack;
    A* partial = s == 0 ? partial_dw : s == 1 ? partial_db : partial_drb;
    const int64_t col = static_cast<int64_t>(p * 32 + owner) * kPack + k;
    if (col < C && partial) partial[blockIdx.x * C + col] = total;
  });
}

// Backward, stage 1, a warp per row (backward_warp_row's math). Warp w of block b takes the
// rows b * W + w, then every gridDim.x * W-th after it (W warps a block). Lane t owns the columns
// (p * 32 + t) * kPack + k (p < kLanePacks, k < kPack) of every row. At the end the block folds
// its warps' sums (write_warp_partials). Bytes: x, g and g_sum read once, dx and dr written
// once, mean and rstd per row, and 2 (3 with kResidualBias) * gridDim.x * C partials in A.
// The lane loads its packs of x, g and g_sum together before using any and keeps them, packed,
// for pass 2 (launder). Up to 168 registers (GPT-2's bf16 rows with the residual bias): one block
// of 12 warps an SM, each with a row's packs (4.5 KB a warp) in flight until its first pass, then
// none while it sums, shuffles and stores. (Staging the rows through shared memory with cp.async,
// to keep loads in flight meanwhile, gave the same bits and no step time: bench/NOTES.md, the
// twenty-first session.)
template <int kLaneValues, bool kResidualBias, typename T, typename G, typename R, typename P,
          typename A = precis::cuda::compute_t<T>>
__global__ void __launch_bounds__(kWarpBackwardThreads, 1)
    layer_norm_backward_warp_kernel(const T* x, const G* g, const T* g_sum, const P* weight, const A* mean,
                                    const A* rstd, T* dx, R* dr, A* partial_dw, A* partial_db, A* partial_drb,
                                    int64_t rows, int64_t C) {
  precis::cuda::wait_for_previous_grid();
  precis::cuda::allow_next_grid_to_start();
  using namespace precis::cuda;
  constexpr int kPack = Packed128<T>::size, kLanePacks = kLaneValues / kPack, kSums = kResidualBias ? 3 : 2;
  static_assert(kLaneValues % kPack == 0, "a lane holds whole packs");
  const int lane = threadIdx.x, warp = threadIdx.y;
  auto column = [lane](int p) { return static_cast<int64_t>(p * 32 + lane) * kPack; };
  // The lane's column sums: [dw, db, drb][p][k], flat so that fold_warps takes them.
  A sums[kSums * kLanePacks * kPack] = {};
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.y;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.y + warp;
  for (int64_t row = first; row < rows; row += stride) {
    Pack<T, kPack> xs[kLanePacks], gs_sum[kLanePacks];
    Pack<G, kPack> gs[kLanePacks];
    const A mu = mean[row], rs = rstd[row];
#pragma unroll
    for (int p = 0; p < kLanePacks; ++p) {
      const int64_t col = column(p);
      if (col >= C) continue;
      xs[p] = load_pack<kPack>(x + row * C + col);
      gs[p] = load_pack<kPack>(g + row * C + col);
      if (g_sum) gs_sum[p] = load_pack<kPack>(g_sum + row * C + col);
    }
    backward_warp_row<kLanePacks, kPack, kResidualBias, T, R, P, A>(
        row, C, lane, mu, rs, weight, g_sum != nullptr, dx, dr, sums, [&](int p) { return xs[p]; },
        [&](int p) { return gs[p]; }, [&](int p) { return gs_sum[p]; },
        [&] {
#pragma unroll
          for (int p = 0; p < kLanePacks; ++p) {
            launder(xs[p]);
            launder(gs[p]);
          }
        });
  }
  write_warp_partials<kLanePacks, kPack, kSums>(sums, C, partial_dw, partial_db, partial_drb);
}

}  // namespace precis::ops::cuda
