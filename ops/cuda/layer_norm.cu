// layer_norm over the last dim, rows of C values (the math is derived in ops/layer_norm.cpp):
//   forward:  mean, rstd = 1/sqrt(var + eps), y = (x - mean) rstd w + b, a warp per row (holding
//             it in registers where it fits) or, for rows over 1024 values, a block per row
//   backward: dx = rstd (dxhat - mean(dxhat) - xhat mean(dxhat xhat)), dxhat = g w; dw = sum g
//             xhat and db = sum g over rows, reduced in two stages: each block sums its rows per
//             column in registers and writes one partial row, then a second kernel adds the
//             partial rows in block order. Rows of up to 768 values (16-byte packs) take a warp
//             per row (ops/cuda/layer_norm_backward_warp.cuh: a block of 12 warps an SM, the
//             warps' sums folded in the block), longer or unpacked rows a block per chunk of
//             rows, one or a few rows at a time. No atomics, so the result is the same on every
//             run (of one GPU model: the grid follows its SMs).
// Statistics, weight and bias in f32 (f64 for f64 x).
//
// The same kernels do the residual add fused with it (add_layer_norm): the forward reads x
// and the residual r, writes their sum s = x + r (rounded to x's dtype T) and normalises s; the
// backward adds the sum's own gradient g_s to ds and writes ds once more in r's dtype where
// that differs (r's gradient), so neither the add nor its gradient costs a pass of its own.
// r may come with a bias rb ([C], the statistics dtype: the bias of the product that made r,
// left to this kernel): s = x + r + rb, and the backward sums ds over rows for rb's gradient,
// a third column sum beside dw and db, so the product's own bias-gradient pass (a read of the
// whole gradient) is not needed.
// x, s and dx are in T; y and its gradient g may be f32 for f16/bf16 T (autocast's f32
// output) or f16/bf16 for f32 T (a norm that feeds a linear under autocast); r and dr may be
// f16/bf16 for f32 T. Mixed dtypes are visited in packs of Packed128<T>::size elements, each
// array moving that many of its own.
//
// The kernels do a few flops per byte, so their speed is memory bandwidth, given enough loads in
// flight. Where a row fits in its threads' registers, each thread issues all its loads of the
// row at once (before any store, which the compiler must assume may alias them) and keeps the
// values for the later passes: each value crosses memory once, and a row waits for memory once.
#include <algorithm>
#include <utility>

#include "core/cuda/block_reduce.cuh"
#include "core/cuda/convert.cuh"
#include "core/cuda/dispatch.cuh"
#include "core/cuda/launch.cuh"
#include "core/cuda/pack.cuh"
#include "ops/cuda/layer_norm.h"
#include "ops/cuda/layer_norm_backward_warp.cuh"
#include "ops/cuda/row_groups.cuh"

namespace precis::ops::cuda {

using namespace precis::cuda;  // the device toolkit (core/cuda/)

namespace {

// s = x + r + rb, summed in A and rounded once to T: the sum add_layer_norm stores and
// normalises (rb: the residual's bias at these columns, zeros without one).
template <int W, typename T, typename R, typename A>
__device__ __forceinline__ Pack<T, W> add_residual(Pack<T, W> x, const Pack<R, W>& r, const Pack<A, W>& rb) {
#pragma unroll
  for (int k = 0; k < W; ++k) x.v[k] = convert_to<T>(convert_to<A>(x.v[k]) + convert_to<A>(r.v[k]) + rb.v[k]);
  return x;
}

// A pack of P values in A (P: the parameters' dtype, A itself or x's f16/bf16 T).
template <typename A, int W, typename P>
__device__ __forceinline__ Pack<A, W> widened(const Pack<P, W>& p) {
  Pack<A, W> out;
#pragma unroll
  for (int k = 0; k < W; ++k) out.v[k] = convert_to<A>(p.v[k]);
  return out;
}

// y = (v - mean) rstd w + b, in Y.
template <typename Y, typename T, typename A>
__device__ __forceinline__ Y normalized(T v, A mu, A rs, A w, A b) {
  return convert_to<Y>((convert_to<A>(v) - mu) * rs * w + b);
}

// Forward: pass 1 sums x (or s = x + r, which it writes) for the mean, pass 2 sums
// (x - mean)^2 (two passes, as the CPU kernel, rather than E[x^2] - mean^2, which cancels),
// pass 3 writes y. With a residual, passes 2 and 3 read s back (each thread its own writes).
// Bytes: x read three times (passes 2 and 3 mostly from L1/L2), y written once, 8 bytes of
// statistics per row; with a residual also r read and s written once (add + layer_norm apart
// would read s again from memory, and launch twice), and its bias (C values) per row from L1.
// Rows that a warp can hold take layer_norm_forward_held_kernel instead.
template <int kThreads, int kPack, typename T, typename R, typename Y, typename A = compute_t<T>>
__global__ void PRECIS_ROW_LAUNCH_BOUNDS(kThreads)
    layer_norm_forward_kernel(const T* x, const R* residual, const A* residual_bias, T* sum_out, const A* weight,
                              const A* bias, Y* y, A* mean, A* rstd, int64_t rows, int64_t C, A eps) {
  precis::cuda::wait_for_previous_grid();
  precis::cuda::allow_next_grid_to_start();
  const int64_t row = row_index();
  if (row >= rows) return;
  Y* yr = y + row * C;
  A sum = 0;
  for_each_in_row<kPack>(x + row * C, C, threadIdx.x, kThreads, [&](int64_t i, auto width) {
    constexpr int W = decltype(width)::value;
    Pack<T, W> v = load_pack<W>(x + row * C + i);
    if (residual) {
      Pack<A, W> rb{};  // its columns need not start a pack of A: element by element
      if (residual_bias) {
#pragma unroll
        for (int k = 0; k < W; ++k) rb.v[k] = residual_bias[i + k];
      }
      v = add_residual(v, load_pack<W>(residual + row * C + i), rb);
      store_pack<W>(sum_out + row * C + i, v);
    }
#pragma unroll
    for (int k = 0; k < W; ++k) sum += convert_to<A>(v.v[k]);
  });
  const T* xr = (residual ? sum_out : x) + row * C;
  const A mu = row_all_reduce<kThreads>(sum, SumOp{}) / static_cast<A>(C);
  A squares = 0;
  for_each_in_row<kPack>(xr, C, threadIdx.x, kThreads, [&](int64_t i, auto width) {
    constexpr int W = decltype(width)::value;
    const Pack<T, W> v = load_pack<W>(xr + i);
#pragma unroll
    for (int k = 0; k < W; ++k) {
      const A d = convert_to<A>(v.v[k]) - mu;
      squares += d * d;
    }
  });
  const A rs = A(1) / ::sqrt(row_all_reduce<kThreads>(squares, SumOp{}) / static_cast<A>(C) + eps);
  for_each_in_row<kPack>(xr, C, threadIdx.x, kThreads, [&](int64_t i, auto width) {
    constexpr int W = decltype(width)::value;
    const Pack<T, W> v = load_pack<W>(xr + i);
    Pack<Y, W> out;
#pragma unroll
    for (int k = 0; k < W; ++k) out.v[k] = normalized<Y>(v.v[k], mu, rs, weight[i + k], bias[i + k]);
    store_pack<W>(yr + i, out);
  });
  if (threadIdx.x == 0) {
    mean[row] = mu;
    rstd[row] = rs;
  }
}

// The packs per lane of the rows a warp holds in registers: at most 8 of 16 bytes (32 registers)
// and 1024 values, so rows of up to 1024 f32 or f16/bf16 values, or 512 f64.
template <typename T>
inline constexpr int kHeldLanePacks = std::min(8, 1024 / (32 * Packed128<T>::size));

// Forward for a row a warp holds: C a multiple of kPack, at most 32 * kHeldLanePacks packs, every
// array (weight and bias too) starting rows at a pack boundary. Lane t takes the packs t, t + 32,
// ..., in the order in which layer_norm_forward_kernel visits them, so both sum alike. Pass 1
// issues all of a lane's loads of x (and r) before anything is stored (the other kernel stores s
// before it loads the next pack, and so waits for memory once per pack); s is written in pass 2,
// and passes 2 and 3 work on the registers.
// Bytes: x (and r) read once, y (and s) written once, weight and bias (and r's bias) read per
// row from L1.
// The parameters (weight, bias, r's bias) come in P: the statistics dtype A, or x's own T (a
// policy with f16/bf16 parameters: then no pass casts them to A first).
template <typename T, typename R, typename Y, typename P, typename A = compute_t<T>>
__global__ void PRECIS_ROW_LAUNCH_BOUNDS(32)
    layer_norm_forward_held_kernel(const T* x, const R* residual, const P* residual_bias, T* sum_out, const P* weight,
                                   const P* bias, Y* y, A* mean, A* rstd, int64_t rows, int64_t C, A eps) {
  precis::cuda::wait_for_previous_grid();
  precis::cuda::allow_next_grid_to_start();
  const int64_t row = row_index();
  if (row >= rows) return;
  constexpr int kPack = Packed128<T>::size, kLanePacks = kHeldLanePacks<T>;
  auto column = [](int p) { return static_cast<int64_t>(p * 32 + threadIdx.x) * kPack; };
  Pack<T, kPack> v[kLanePacks];
  A sum = 0;
#pragma unroll
  for (int p = 0; p < kLanePacks; ++p) {
    const int64_t col = column(p);
    if (col >= C) continue;
    v[p] = load_pack<kPack>(x + row * C + col);
    if (residual)
      v[p] = add_residual(v[p], load_pack<kPack>(residual + row * C + col),
                          residual_bias ? widened<A>(load_pack<kPack>(residual_bias + col)) : Pack<A, kPack>{});
#pragma unroll
    for (int k = 0; k < kPack; ++k) sum += convert_to<A>(v[p].v[k]);
  }
  const A mu = warp_all_reduce(sum, SumOp{}) / static_cast<A>(C);
  A squares = 0;
#pragma unroll
  for (int p = 0; p < kLanePacks; ++p) {
    const int64_t col = column(p);
    if (col >= C) continue;
    if (residual) store_pack<kPack>(sum_out + row * C + col, v[p]);
#pragma unroll
    for (int k = 0; k < kPack; ++k) {
      const A d = convert_to<A>(v[p].v[k]) - mu;
      squares += d * d;
    }
  }
  const A rs = A(1) / ::sqrt(warp_all_reduce(squares, SumOp{}) / static_cast<A>(C) + eps);
#pragma unroll
  for (int p = 0; p < kLanePacks; ++p) {
    const int64_t col = column(p);
    if (col >= C) continue;
    const Pack<A, kPack> w = widened<A>(load_pack<kPack>(weight + col)), b = widened<A>(load_pack<kPack>(bias + col));
    Pack<Y, kPack> out;
#pragma unroll
    for (int k = 0; k < kPack; ++k) out.v[k] = normalized<Y>(v[p].v[k], mu, rs, w.v[k], b.v[k]);
    store_pack<kPack>(y + row * C + col, out);
  }
  if (threadIdx.x == 0) {
    mean[row] = mu;
    rstd[row] = rs;
  }
}

// Reduces over each slice of a block (threadIdx.y picks the slice: a row of blockDim.x threads,
// a multiple of 32, so a warp never spans two), each slice apart; every thread must call it.
// With one slice, the order of block_all_reduce.
template <typename V, typename Op>
__device__ __forceinline__ V slice_all_reduce(V v, Op op) {
  __shared__ V partial[32];  // a value per warp, a slice's warps side by side
  v = warp_all_reduce(v, op);
  const int warps = blockDim.x / 32, first_warp = threadIdx.y * warps;
  if (threadIdx.x % 32 == 0) partial[first_warp + threadIdx.x / 32] = v;
  __syncthreads();
  v = partial[first_warp];
  for (int w = 1; w < warps; ++w) v = op(v, partial[first_warp + w]);
  __syncthreads();  // partial is free for the next reduction
  return v;
}

// Adds the column sums (dw, db and, with a residual bias, its gradient's) of each column's
// owners (the threads of one threadIdx.x) over the slices, in slice order, into slice 0's;
// every thread must call it.
template <int kPacks, int kPack, typename A, typename... Sums>
__device__ __forceinline__ void sum_over_slices(Sums&... sums) {
  constexpr int kSums = sizeof...(Sums);
  __shared__ A staged[kSums][1024];
  const int own = threadIdx.y * blockDim.x + threadIdx.x;
#pragma unroll
  for (int p = 0; p < kPacks; ++p) {
#pragma unroll
    for (int k = 0; k < kPack; ++k) {
      int n = 0;
      ((staged[n++][own] = sums[p][k]), ...);
      __syncthreads();
      if (threadIdx.y == 0) {
        for (int s = 1; s < blockDim.y; ++s) {
          n = 0;
          ((sums[p][k] += staged[n++][s * blockDim.x + threadIdx.x]), ...);
        }
      }
      __syncthreads();  // staged is free for the next value
    }
  }
}

// Whether the backward keeps a row's x, g and g_sum packs in registers from pass 1 to pass 2:
// when they and the thread's dw and db sums take at most 96 bytes (24 registers), as for one
// pack of 4 f32 or 2 f64 values, or up to 4 single values. Threads of more values (f16/bf16
// packs, the 1024 threads of rows longer than 1024 packs) would run out of registers; they read
// x and g again in pass 2 (mostly from L1), and g_sum there. The blocks of at most 256 threads
// (kAhead below) have registers enough to hold any row of one pack a thread.
template <int kPacks, int kPack, typename T, typename G>
inline constexpr bool kHoldsRow = (2 * sizeof(compute_t<T>) + 2 * sizeof(T) + sizeof(G)) * (kPacks * kPack) <= 96;

// Backward, stage 1: block b takes rows [b * rows_per_block, ...), blockDim.y at a time: slice y
// (the blockDim.x threads of threadIdx.y = y) takes the rows first + y, first + blockDim.y + y,
// ... Thread (t, y) owns the columns (p * blockDim.x + t) * kPack + k, p < kPacks, k < kPack, for
// all its rows, so its dw and db sums stay in registers. Per row, one slice reduction gives
// mean(dxhat) and mean(dxhat xhat); then dx (plus g_sum, when given) is written, to dx and/or,
// in the residual's dtype, to dr (null: not wanted). kResidualBias: the thread also sums those
// values (in A, before they are rounded to T or R: the sum's gradient) per column, the
// gradient of the residual's bias. At the end the slices' sums are added in slice order and
// each block writes its partial dw, db (and residual-bias) rows to partial_dw, partial_db and
// partial_drb [blocks, C] (null: not wanted).
// Held rows (kHoldsRow, or kAhead): pass 1 loads x, g and g_sum, and pass 2 works on the
// registers. kAhead (rows of one pack a thread, blocks of at most 256 threads, so up to 255
// registers a thread): a slice's next row (x, g, g_sum, mean, rstd) is loaded before this row is
// reduced and written, so a row's memory latency hides behind the last row's work. Without it
// each row cost a memory round trip plus the reduction's barriers, 32 rows one after another
// per block: GPT-2's backward (rows of 768) ran at ~60-70% of its bytes' time on an H100.
// kAhead with kResidualBias takes ~94 registers for bf16 rows (78 without the third sum), so
// GPT-2's blocks (rows of 768 bf16: 96 threads x 2 slices) fit 3 to an SM, not 4; the grid is
// sized to what is resident (backward_blocks), so that costs no second wave. Holding it to 80
// registers (__launch_bounds__(256, 3)) made ptxas spill 24 bytes a thread, and the spilling
// kernel was slower than the one without the bias (bench/NOTES.md).
// Bytes: x, g and g_sum read once from memory (other rows read x and g again, mostly from L1),
// dx and dr written once (the fused add: apart, the gradients' sum and r's cast would each be a
// pass of their own; and the residual bias's gradient, a pass over ds of the product's own);
// 2 (3 with kResidualBias) * blocks * C statistics-dtype values of partials.
template <int kPacks, int kPack, bool kAhead, bool kResidualBias, typename T, typename G, typename R, typename P,
          typename A = compute_t<T>>
__global__ void __launch_bounds__(kAhead ? 256 : 1024)
    layer_norm_backward_kernel(const T* x, const G* g, const T* g_sum, const P* weight, const A* mean, const A* rstd,
                               T* dx, R* dr, A* partial_dw, A* partial_db, A* partial_drb, int64_t rows, int64_t C,
                               int64_t rows_per_block) {
  precis::cuda::wait_for_previous_grid();
  precis::cuda::allow_next_grid_to_start();
  static_assert(!kAhead || kPacks == 1, "the load ahead is for rows of one pack a thread");
  constexpr bool kHeld = kAhead || kHoldsRow<kPacks, kPack, T, G>;
  const int64_t first = blockIdx.x * rows_per_block;
  const int64_t last = first + rows_per_block < rows ? first + rows_per_block : rows;
  auto column = [](int p) { return (static_cast<int64_t>(p) * blockDim.x + threadIdx.x) * kPack; };
  // A row's packs and statistics; load_row fills one (kAhead: the next row, in one go).
  struct Row {
    Pack<T, kPack> x[kPacks], g_sum[kPacks];
    Pack<G, kPack> g[kPacks];
    A mu, rs;
  };
  auto load_row = [&](int64_t row, Row& r) {
    if (row >= last) return;
    r.mu = mean[row];
    r.rs = rstd[row];
#pragma unroll
    for (int p = 0; p < kPacks; ++p) {
      const int64_t col = column(p);
      if (col >= C) continue;
      r.x[p] = load_pack<kPack>(x + row * C + col);
      r.g[p] = load_pack<kPack>(g + row * C + col);
      if (g_sum) r.g_sum[p] = load_pack<kPack>(g_sum + row * C + col);
    }
  };
  A dw[kPacks][kPack] = {}, db[kPacks][kPack] = {};
  A drb[kResidualBias ? kPacks : 1][kPack] = {};  // the residual bias's gradient (kResidualBias)
  Row ahead;                                      // kAhead: the slice's next row, loading while this one is worked on
  if constexpr (kAhead) load_row(first + threadIdx.y, ahead);
  for (int64_t step = first; step < last; step += blockDim.y) {
    const int64_t row = step + threadIdx.y;
    const bool has_row = row < last;  // the chunk's last step may leave slices without a row
    Row cur;
    if constexpr (kAhead) {
      cur = ahead;
      load_row(row + blockDim.y, ahead);
    } else if (has_row) {
      cur.mu = mean[row];
      cur.rs = rstd[row];
    }
    const A mu = has_row ? cur.mu : A(0), rs = has_row ? cur.rs : A(0);
    Pair<A> sums{0, 0};  // sum dxhat, sum dxhat xhat
#pragma unroll
    for (int p = 0; p < kPacks; ++p) {
      const int64_t col = column(p);
      if (!has_row || col >= C) continue;
      if constexpr (!kAhead) {
        cur.x[p] = load_pack<kPack>(x + row * C + col);
        cur.g[p] = load_pack<kPack>(g + row * C + col);
        if (kHeld && g_sum) cur.g_sum[p] = load_pack<kPack>(g_sum + row * C + col);
      }
#pragma unroll
      for (int k = 0; k < kPack; ++k) {
        const A xhat = (convert_to<A>(cur.x[p].v[k]) - mu) * rs;
        const A dxhat = convert_to<A>(cur.g[p].v[k]) * convert_to<A>(weight[col + k]);
        sums.first += dxhat;
        sums.second += dxhat * xhat;
      }
    }
    sums = slice_all_reduce(sums, SumOp{});
    const A mean_dxhat = sums.first / static_cast<A>(C), mean_dxhat_xhat = sums.second / static_cast<A>(C);
#pragma unroll
    for (int p = 0; p < kPacks; ++p) {
      const int64_t col = column(p);
      if (!has_row || col >= C) continue;
      if constexpr (!kHeld) {  // x and g again, mostly from L1
        cur.x[p] = load_pack<kPack>(x + row * C + col);
        cur.g[p] = load_pack<kPack>(g + row * C + col);
        if (g_sum) cur.g_sum[p] = load_pack<kPack>(g_sum + row * C + col);
      }
      Pack<T, kPack> out;
      Pack<R, kPack> out_r;
#pragma unroll
      for (int k = 0; k < kPack; ++k) {
        const A xhat = (convert_to<A>(cur.x[p].v[k]) - mu) * rs, gk = convert_to<A>(cur.g[p].v[k]);
        dw[p][k] += gk * xhat;
        db[p][k] += gk;
        A d = rs * (gk * convert_to<A>(weight[col + k]) - mean_dxhat - xhat * mean_dxhat_xhat);
        if (g_sum) d += convert_to<A>(cur.g_sum[p].v[k]);
        if constexpr (kResidualBias) drb[p][k] += d;
        out.v[k] = convert_to<T>(d);
        out_r.v[k] = convert_to<R>(d);
      }
      if (dx) store_pack<kPack>(dx + row * C + col, out);
      if (dr) store_pack<kPack>(dr + row * C + col, out_r);
    }
  }
  if constexpr (kPacks == 1) {  // only rows of one pack a thread come several to a block
    if constexpr (kResidualBias) {
      if (blockDim.y > 1) sum_over_slices<kPacks, kPack, A>(dw, db, drb);
    } else {
      if (blockDim.y > 1 && (partial_dw || partial_db)) sum_over_slices<kPacks, kPack, A>(dw, db);
    }
  }
  if (threadIdx.y != 0) return;
#pragma unroll
  for (int p = 0; p < kPacks; ++p) {
    const int64_t col = column(p);
    if (col >= C) continue;
#pragma unroll
    for (int k = 0; k < kPack; ++k) {
      if (partial_dw) partial_dw[blockIdx.x * C + col + k] = dw[p][k];
      if (partial_db) partial_db[blockIdx.x * C + col + k] = db[p][k];
      if constexpr (kResidualBias) partial_drb[blockIdx.x * C + col + k] = drb[p][k];
    }
  }
}

// One column sum of stage 1: its partial rows [blocks, C] and where it goes (null: not wanted):
// `out` in the statistics dtype A, or `narrow_out` in x's dtype T (a 16-bit parameter's 16-bit
// .grad: the f32 sum rounded once), added to what it holds where `accumulate` (a parameter's
// .grad, written where it lies; a 16-bit one takes the sum of the two rounded once).
template <typename A, typename T>
struct ColumnSum {
  const A* partial = nullptr;
  A* out = nullptr;
  T* narrow_out = nullptr;
  bool accumulate = false;
};

// Backward, stage 2: out[c] = sum over b of partial[b, c], b in order, for dw (blockIdx.y
// 0), db (1) and the residual bias's gradient (2). A block covers 32 columns; its kSlices
// rows of threads each sum every kSlices-th partial row, then one thread per column adds the
// slices in order, and (to a 16-bit out) rounds once. Bytes: the partials read once, C values
// written per sum.
constexpr int kSlices = 16;
template <typename A, typename T>
__global__ void __launch_bounds__(32 * kSlices)
    layer_norm_param_grads_kernel(ColumnSum<A, T> dw, ColumnSum<A, T> db, ColumnSum<A, T> drb, int64_t blocks,
                                  int64_t C) {
  precis::cuda::wait_for_previous_grid();
  precis::cuda::allow_next_grid_to_start();
  const ColumnSum<A, T> target = blockIdx.y == 0 ? dw : blockIdx.y == 1 ? db : drb;
  const A* partial = target.partial;
  A* out = target.out;
  T* narrow_out = target.narrow_out;
  const bool accumulate = target.accumulate;
  if (!out && !narrow_out) return;
  __shared__ A slices[kSlices][33];
  const int64_t col = static_cast<int64_t>(blockIdx.x) * 32 + threadIdx.x;
  A sum = 0;
  if (col < C)
    for (int64_t b = threadIdx.y; b < blocks; b += kSlices) sum += partial[b * C + col];
  slices[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y == 0 && col < C) {
    for (int s = 1; s < kSlices; ++s) sum += slices[s][threadIdx.x];
    if (out)
      out[col] = accumulate ? out[col] + sum : sum;
    else
      narrow_out[col] = convert_to<T>(accumulate ? convert_to<A>(narrow_out[col]) + sum : sum);
  }
}

// The longest row the backward kernel takes: kPacks * kPack <= kMaxPerThread<A> values per
// thread (their dw and db sums fit in registers), 1024 threads.
template <typename A>
inline constexpr int kMaxPerThread = 64 / sizeof(A);
// Blocks of at most 256 threads where a row needs no more: rows of one pack a thread and at
// most 128 threads are taken blockDim.y (the slices) at a time.
constexpr int kBackwardBlockThreads = 256;

// Stage 1's grid: as many blocks as the GPU holds at once (resident_blocks_per_sm for `kernel`
// at `threads` a block, times the SMs), so every block is
// resident from the start and none waits for a second wave; each takes an equal share of the
// rows, and writes one partial row per column sum. The load-ahead kernels take 62 (f32 rows),
// 78 (bf16 rows) and ~94 (bf16 rows with the residual bias) registers: 4, 4 and 3 of GPT-2's
// blocks of 192 threads an SM. Returns {blocks, rows_per_block}.
std::pair<int64_t, int64_t> backward_blocks(const void* kernel, int threads, int64_t rows, Device device) {
  const int64_t wanted = static_cast<int64_t>(precis::cuda::resident_blocks_per_sm(kernel, threads)) *
                         precis::cuda::multiprocessor_count(device);
  const int64_t rows_per_block = (rows + wanted - 1) / wanted;
  return {(rows + rows_per_block - 1) / rows_per_block, rows_per_block};
}

// Calls run(kernel) with the backward kernel of the fewest packs per thread (a power of
// two) that covers `packs`; the row-length check keeps packs * kPack <= kMaxPerThread.
template <int kPacks, int kPack, bool kResidualBias, typename T, typename G, typename R, typename Run>
void run_with_packs(int64_t packs, Run&& run) {
  if constexpr (kPacks * kPack >= kMaxPerThread<compute_t<T>>) {
    run(layer_norm_backward_kernel<kPacks, kPack, false, kResidualBias, T, G, R, compute_t<T>>);
  } else {
    if (packs <= kPacks)
      run(layer_norm_backward_kernel<kPacks, kPack, false, kResidualBias, T, G, R, compute_t<T>>);
    else
      run_with_packs<kPacks * 2, kPack, kResidualBias, T, G, R>(packs, run);
  }
}

// Calls run(kernel) with the warp-per-row backward kernel of the fewest values a lane (8, 16,
// 24) that cover a row of C values.
template <bool kResidualBias, typename T, typename G, typename R, typename P, typename Run>
void run_with_lane_values(int64_t C, Run&& run) {
  if (C <= 32 * 8)
    run(layer_norm_backward_warp_kernel<8, kResidualBias, T, G, R, P>);
  else if (C <= 32 * 16)
    run(layer_norm_backward_warp_kernel<16, kResidualBias, T, G, R, P>);
  else
    run(layer_norm_backward_warp_kernel<24, kResidualBias, T, G, R, P>);
}
static_assert(kWarpBackwardMaxLaneValues == 24, "run_with_lane_values covers every lane size");

// Calls fn(TypeTag<U>) with the device type of `dtype`, a dtype the kernels take beside x's T:
// T, f16/bf16 beside f32 T, and (for y and its gradient: `residual` false) f32 beside f16/bf16 T.
template <typename T, typename Fn>
void dispatch_beside(DType x_dtype, DType dtype, bool residual, const char* op, Fn&& fn) {
  if (dtype == x_dtype) return fn(TypeTag<T>{});
  if constexpr (std::is_same_v<T, float>) {
    if (dtype == DType::f16) return fn(TypeTag<__half>{});
    if (dtype == DType::bf16) return fn(TypeTag<__nv_bfloat16>{});
  } else if constexpr (is_half_v<T>) {
    if (!residual && dtype == DType::f32) return fn(TypeTag<float>{});
  }
  PRECIS_FAIL(op, ": no CUDA kernel for a ", dtype, residual ? " residual" : " output", " beside a ", x_dtype,
              " input");
}

template <typename U>
U* pointer(const Tensor& t) {
  return t.defined() ? static_cast<U*>(t.raw_data()) : nullptr;
}

}  // namespace

void layer_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps, const Tensor& y,
                        const Tensor& mean, const Tensor& rstd, const Tensor& residual, const Tensor& sum,
                        const Tensor& residual_bias) {
  const char* op = residual.defined() ? "add_layer_norm" : "layer_norm";
  const int64_t C = x.shape().back(), rows = C == 0 ? 0 : x.numel() / C;
  if (rows == 0) return;
  cudaStream_t stream = stream_for(x);
  dispatch_floating(x.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = compute_t<T>;
    dispatch_beside<T>(x.dtype(), residual.defined() ? residual.dtype() : x.dtype(), true, op, [&](auto r_tag) {
      using R = typename decltype(r_tag)::type;
      dispatch_beside<T>(x.dtype(), y.dtype(), false, op, [&](auto y_tag) {
        using Y = typename decltype(y_tag)::type;
        const T* xp = pointer<const T>(x);
        const R* rp = pointer<const R>(residual);
        T* sp = pointer<T>(sum);
        Y* yp = pointer<Y>(y);
        constexpr int kWide = Packed128<T>::size;
        const bool packed =
            same_pack_phase<kWide>(xp, rp) && same_pack_phase<kWide>(xp, sp) && same_pack_phase<kWide>(xp, yp);
        // Launches with the parameters in P; false (nothing launched) where P is not A and the
        // row does not take the held kernel, the one kernel that reads them in T.
        auto launch_with = [&](auto p_tag, const Tensor& w, const Tensor& b, const Tensor& rb) {
          using P = typename decltype(p_tag)::type;
          const P *wp = pointer<const P>(w), *bp = pointer<const P>(b), *rbp = pointer<const P>(rb);
          auto launch = [&](auto threads, auto kernel) {
            constexpr int kThreads = decltype(threads)::value;
            precis::cuda::launch(kernel, row_grid<kThreads>(rows), row_block<kThreads>(), 0, stream, xp, rp, rbp, sp,
                                 wp, bp, yp, pointer<A>(mean), pointer<A>(rstd), rows, C, static_cast<A>(eps));
          };
          // A warp holds the row when every row of every array starts at a pack boundary and fits.
          const bool held = packed && pack_aligned<kWide>(xp) && C % kWide == 0 &&
                            C <= 32 * kHeldLanePacks<T> * kWide && pack_aligned<kWide>(wp) && pack_aligned<kWide>(bp) &&
                            pack_aligned<kWide>(rbp);
          if (held) {
            launch(std::integral_constant<int, 32>{}, layer_norm_forward_held_kernel<T, R, Y, P>);
            return true;
          }
          if constexpr (!std::is_same_v<P, A>) {
            return false;
          } else {
            dispatch_row_threads(C, [&](auto threads) {
              constexpr int kThreads = decltype(threads)::value;
              if (packed)
                launch(threads, layer_norm_forward_kernel<kThreads, kWide, T, R, Y>);
              else
                launch(threads, layer_norm_forward_kernel<kThreads, 1, T, R, Y>);
            });
            return true;
          }
        };
        // In T only where all three are (a mix goes to A, each cast as needed).
        const bool narrow_params = !std::is_same_v<T, A> && weight.dtype() == x.dtype() && bias.dtype() == x.dtype() &&
                                   (!residual_bias.defined() || residual_bias.dtype() == x.dtype());
        if (!narrow_params || !launch_with(TypeTag<T>{}, weight, bias, residual_bias)) {
          auto wide = [&](const Tensor& p) {
            return p.defined() && p.dtype() != mean.dtype() ? p.to(mean.dtype()) : p;
          };
          launch_with(TypeTag<A>{}, wide(weight), wide(bias), wide(residual_bias));
        }
      });
    });
  });
  PRECIS_CUDA_CHECK_LAUNCH(op);
}

void layer_norm_backward(const Tensor& x, const Tensor& g, const Tensor& weight, const Tensor& mean, const Tensor& rstd,
                         const Tensor& dx, const Tensor& dweight, const Tensor& dbias, const Tensor& g_sum,
                         const Tensor& dresidual, bool accumulate_dweight, bool accumulate_dbias,
                         const Tensor& dresidual_bias, bool accumulate_dresidual_bias) {
  const char* op = g_sum.defined() || dresidual.defined() || dresidual_bias.defined() ? "add_layer_norm backward"
                                                                                      : "layer_norm backward";
  const int64_t C = x.shape().back(), rows = C == 0 ? 0 : x.numel() / C;
  if (C == 0) return;
  cudaStream_t stream = stream_for(x);
  const bool residual_bias = dresidual_bias.defined();
  const bool param_grads = dweight.defined() || dbias.defined() || residual_bias;
  if (rows == 0) {  // no rows: the parameter gradients are sums of nothing
    for (const auto& [grad, accumulate] : {std::pair{&dweight, accumulate_dweight}, std::pair{&dbias, accumulate_dbias},
                                           std::pair{&dresidual_bias, accumulate_dresidual_bias}}) {
      if (grad->defined() && !accumulate)
        PRECIS_CUDA_CHECK(cudaMemsetAsync(grad->raw_data(), 0, grad->nbytes(), stream), op);
    }
    return;
  }
  dispatch_floating(x.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = compute_t<T>;
    PRECIS_CHECK(C <= 1024 * kMaxPerThread<A>, op, ": rows of ", C, " values are longer than the CUDA kernel takes (",
                 1024 * kMaxPerThread<A>, " for ", x.dtype(), ")");
    dispatch_beside<T>(x.dtype(), g.dtype(), false, op, [&](auto g_tag) {
      using G = typename decltype(g_tag)::type;
      dispatch_beside<T>(x.dtype(), dresidual.defined() ? dresidual.dtype() : x.dtype(), true, op, [&](auto r_tag) {
        using R = typename decltype(r_tag)::type;
        const T* xp = pointer<const T>(x);
        const G* gp = pointer<const G>(g);
        const T* gsp = pointer<const T>(g_sum);
        T* dxp = pointer<T>(dx);
        R* drp = pointer<R>(dresidual);
        // Packs need every row to start at a pack boundary: C a multiple of the pack and aligned bases.
        constexpr int kWide = Packed128<T>::size;
        const bool packed = C % kWide == 0 && pack_aligned<kWide>(xp) && pack_aligned<kWide>(gp) &&
                            pack_aligned<kWide>(gsp) && pack_aligned<kWide>(dxp) && pack_aligned<kWide>(drp);
        auto launch = [&](auto pack, auto with_residual_bias) {
          constexpr int kPack = decltype(pack)::value;
          constexpr bool kResidualBias = decltype(with_residual_bias)::value;
          const int64_t per_row = (C + kPack - 1) / kPack;
          const int threads = static_cast<int>(std::min<int64_t>(1024, (per_row + 31) / 32 * 32));
          const int64_t packs = (per_row + threads - 1) / threads;
          const int slices = packs == 1 ? std::max(1, kBackwardBlockThreads / threads) : 1;
          const dim3 block(threads, slices);
          // Stage 1 (stage1(partial_dw, partial_db, partial_drb) launches it over `blocks` blocks),
          // then stage 2 over its partial rows, [2 or 3, blocks, C]: dw, db, then the residual bias's gradient.
          auto with_partials = [&](int64_t blocks, auto&& stage1) {
            Tensor partials =
                param_grads ? empty({residual_bias ? 3 : 2, blocks, C}, mean.dtype(), x.device()) : Tensor();
            A* partial_dw = dweight.defined() ? pointer<A>(partials) : nullptr;
            A* partial_db = dbias.defined() ? pointer<A>(partials) + blocks * C : nullptr;
            A* partial_drb = residual_bias ? pointer<A>(partials) + 2 * blocks * C : nullptr;
            stage1(partial_dw, partial_db, partial_drb);
            PRECIS_CUDA_CHECK_LAUNCH(op);
            if (!param_grads) return;
            // Each parameter gradient in A, or in T (a 16-bit .grad) where it is of x's dtype.
            auto column_sum = [&](const A* partial, const Tensor& out, bool accumulate) {
              const bool narrow = out.defined() && out.dtype() == x.dtype() && out.dtype() != mean.dtype();
              return ColumnSum<A, T>{partial, narrow ? nullptr : pointer<A>(out), narrow ? pointer<T>(out) : nullptr,
                                     accumulate};
            };
            const ColumnSum<A, T> dw = column_sum(partial_dw, dweight, accumulate_dweight),
                                  db = column_sum(partial_db, dbias, accumulate_dbias),
                                  drb = column_sum(partial_drb, dresidual_bias, accumulate_dresidual_bias);
            precis::cuda::launch(layer_norm_param_grads_kernel<A, T>,
                                 dim3(static_cast<unsigned>((C + 31) / 32), residual_bias ? 3 : 2), dim3(32, kSlices),
                                 0, stream, dw, db, drb, blocks, C);
            PRECIS_CUDA_CHECK_LAUNCH(op);
          };
          auto run = [&](auto kernel, const auto* weight_data) {
            const auto [blocks, rows_per_block] =
                backward_blocks(reinterpret_cast<const void*>(kernel), threads * slices, rows, x.device());
            with_partials(blocks, [&](A* partial_dw, A* partial_db, A* partial_drb) {
              precis::cuda::launch(kernel, static_cast<unsigned>(blocks), block, 0, stream, xp, gp, gsp, weight_data,
                                   pointer<const A>(mean), pointer<const A>(rstd), dxp, drp, partial_dw, partial_db,
                                   partial_drb, rows, C, rows_per_block);
            });
          };
          // The warp-per-row kernel: one block of kWarpBackwardThreads per resident slot (one an
          // SM), none without rows.
          auto run_warp = [&](auto kernel, const auto* weight_data) {
            constexpr int kWarps = kWarpBackwardThreads / 32;
            const int64_t resident = static_cast<int64_t>(precis::cuda::resident_blocks_per_sm(
                                         reinterpret_cast<const void*>(kernel), kWarpBackwardThreads)) *
                                     precis::cuda::multiprocessor_count(x.device());
            const int64_t blocks = std::min(resident, (rows + kWarps - 1) / kWarps);
            with_partials(blocks, [&](A* partial_dw, A* partial_db, A* partial_drb) {
              precis::cuda::launch(kernel, static_cast<unsigned>(blocks), dim3(32, kWarps), 0, stream, xp, gp, gsp,
                                   weight_data, pointer<const A>(mean), pointer<const A>(rstd), dxp, drp, partial_dw,
                                   partial_db, partial_drb, rows, C);
            });
          };
          // The load-ahead kernel reads the weight in x's dtype where it is so (bf16-pure's norms),
          // the others in A (cast here).
          const bool narrow_weight = !std::is_same_v<T, A> && weight.dtype() == x.dtype();
          if constexpr (kPack == kWide && !std::is_same_v<T, double>) {
            // Rows a warp holds (every array packed, the weight too) take the warp-per-row kernel,
            // reading the weight as the load-ahead kernel does.
            if (C <= 32 * kWarpBackwardMaxLaneValues) {
              const bool weight_packed = narrow_weight ? pack_aligned<kPack>(pointer<const T>(weight))
                                                       : pack_aligned<kPack>(pointer<const A>(weight));
              if (weight_packed) {
                if (narrow_weight)
                  run_with_lane_values<kResidualBias, T, G, R, T>(
                      C, [&](auto kernel) { run_warp(kernel, pointer<const T>(weight)); });
                else
                  run_with_lane_values<kResidualBias, T, G, R, A>(
                      C, [&](auto kernel) { run_warp(kernel, pointer<const A>(weight)); });
                return;
              }
            }
          }
          if (packs == 1 && threads * slices <= kBackwardBlockThreads) {
            if (narrow_weight)
              run(layer_norm_backward_kernel<1, kPack, true, kResidualBias, T, G, R, T>, pointer<const T>(weight));
            else
              run(layer_norm_backward_kernel<1, kPack, true, kResidualBias, T, G, R, A>, pointer<const A>(weight));
          } else {
            const Tensor weight_a = narrow_weight ? weight.to(mean.dtype()) : weight;
            run_with_packs<1, kPack, kResidualBias, T, G, R>(
                packs, [&](auto kernel) { run(kernel, pointer<const A>(weight_a)); });
          }
        };
        auto launch_packed = [&](auto with_residual_bias) {
          if (packed)
            launch(Width<kWide>{}, with_residual_bias);
          else
            launch(Width<1>{}, with_residual_bias);
        };
        if (residual_bias)
          launch_packed(std::true_type{});
        else
          launch_packed(std::false_type{});
      });
    });
  });
}

}  // namespace precis::ops::cuda
