// The layer norm backward's stage 1 for uniform 16-bit rows of 257 to 768 values (GPT-2's:
// x, g, g_sum, dx and dr all in one 16-bit T), with the next rows' loads in flight while a row
// computes: a variant of ops/cuda/layer_norm_backward_warp.cuh's kernel behind the temporary
// switch PRECIS_AB_LN_BWD (ops/cuda/layer_norm.h), included by ops/cuda/layer_norm.cu.
//
// The warp kernel issues a row's loads (each lane its packs of x, g, g_sum: 4.5 KB a warp for
// rows of 768) and then waits for them, computes and stores: between its rows a warp has no load
// in flight, so an SM's 12 warps keep at most 54 KB, and on average much less, in flight. By
// Little's law the HBM's ~3 TB/s at ~1 us latency needs ~3 MB in flight, ~23 KB an SM, all the
// time. Here each warp keeps a ring of kAsyncBackwardStages stages in shared memory (a stage:
// one row's packs of x, g and g_sum, as the lanes own them), filled by cp.async (16 bytes, .cg:
// past L1), and its pipeline runs
//     fill rows n, n + 1;  then for each row n:  fill row n + 2 (into the stage row n - 1 used),
//                                               wait for row n (cp.async.wait_group 2), compute it
// so rows n + 1 and n + 2 (2 x 4.5 KB a warp, 108 KB an SM of 12 warps) are in flight while row
// n computes. Each lane waits only for its own copies and reads only the slots it filled, so a
// row needs no barrier. mean and rstd of row n + 2 are loaded into registers at the same point.
// The row's values are read from shared memory in each pass, not kept in registers between
// them (fewer registers: 16 warps an SM fit too, kAsyncBackwardWarps16).
//
// The math (warp_backward_math: every rounding pinned, so nvcc cannot fuse the two kernels'
// multiply-adds differently), the lanes' columns, the rows of each warp (for the same number of
// warps a block) and the fold of the warps' column sums are the warp kernel's, in the same
// order: with 12 warps a block the results are the same bits. With 16 warps the rows fall to other warps and
// blocks, so dw, db and the residual bias's gradient are summed in another order (dx is the same).
// The fold reuses the ring's shared memory (every warp has left its rows by then).
// Shared memory: warps x stages x 3 x (row bytes), 162 KB for 12 warps of 768-value rows, 216
// KB for 16; one block an SM, as the warp kernel.
#pragma once

#include <cstdint>
#include <type_traits>

#include "core/cuda/block_reduce.cuh"
#include "core/cuda/convert.cuh"
#include "core/cuda/launch.cuh"
#include "core/cuda/pack.cuh"
#include "ops/cuda/layer_norm_backward_warp.cuh"

namespace precis::ops::cuda {

inline constexpr int kAsyncBackwardStages = 3;
inline constexpr int kAsyncBackwardWarps12 = 12, kAsyncBackwardWarps16 = 16;

// The dynamic shared memory of a block: each warp's ring of stages of x, g and g_sum.
template <int kWarps, int kLaneValues, typename T>
constexpr int async_backward_shared_bytes() {
  return kWarps * kAsyncBackwardStages * 3 * kLaneValues * 32 * static_cast<int>(sizeof(T));
}

namespace async_copy {

// 16 bytes global -> shared, past L1. The "memory" clobbers keep the compiler from moving this
// thread's shared loads of a stage across the copies that refill it and the wait for them.
__device__ __forceinline__ void copy16(void* shared, const void* global) {
  const auto address = static_cast<uint32_t>(__cvta_generic_to_shared(shared));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(address), "l"(global) : "memory");
}
__device__ __forceinline__ void commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Waits until at most kPending of this thread's committed groups are still copying.
template <int kPending>
__device__ __forceinline__ void wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

}  // namespace async_copy

// Backward, stage 1: layer_norm_backward_warp_kernel's math (see there) for T = G = R, a 16-bit
// type, kWarps warps a block, rows fetched kAsyncBackwardStages - 1 ahead (the head comment).
template <int kWarps, int kLaneValues, bool kResidualBias, typename T, typename P,
          typename A = precis::cuda::compute_t<T>>
__global__ void __launch_bounds__(kWarps * 32, 1)
    layer_norm_backward_async_kernel(const T* x, const T* g, const T* g_sum, const P* weight, const A* mean,
                                     const A* rstd, T* dx, T* dr, A* partial_dw, A* partial_db, A* partial_drb,
                                     int64_t rows, int64_t C) {
  precis::cuda::wait_for_previous_grid();
  precis::cuda::allow_next_grid_to_start();
  using namespace precis::cuda;
  constexpr int kPack = Packed128<T>::size, kLanePacks = kLaneValues / kPack, kSums = kResidualBias ? 3 : 2;
  constexpr int kStages = kAsyncBackwardStages;
  static_assert(sizeof(T) == 2 && kLaneValues % kPack == 0, "whole 16-byte packs of a 16-bit type");
  static_assert(std::is_same_v<A, float>, "warp_backward_math is in f32");
  constexpr int kArrayBytes = kLanePacks * 32 * 16;  // a warp's stage of one array: a row
  constexpr int kWarpBytes = kStages * 3 * kArrayBytes;
  extern __shared__ uint4 shared_words[];  // 16-byte aligned
  const int lane = threadIdx.x, warp = threadIdx.y;
  unsigned char* ring = reinterpret_cast<unsigned char*>(shared_words) + warp * kWarpBytes;
  // Lane t's pack p of array a (x, g, g_sum) in a stage: lanes side by side, no bank conflicts.
  auto slot = [ring, lane](int stage, int a, int p) {
    return ring + (stage * 3 + a) * kArrayBytes + (p * 32 + lane) * 16;
  };
  auto column = [lane](int p) { return static_cast<int64_t>(p * 32 + lane) * kPack; };
  auto read = [](const unsigned char* at) { return *reinterpret_cast<const Pack<T, kPack>*>(at); };
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kWarps;
  // Starts the copies of the row's packs into the stage (none past the last row) and commits
  // them as a group (an empty one past the last row, so that every row is two groups back).
  auto fetch = [&](int64_t row, int stage) {
    if (row < rows) {
#pragma unroll
      for (int p = 0; p < kLanePacks; ++p) {
        const int64_t col = column(p);
        if (col >= C) continue;
        async_copy::copy16(slot(stage, 0, p), x + row * C + col);
        async_copy::copy16(slot(stage, 1, p), g + row * C + col);
        if (g_sum) async_copy::copy16(slot(stage, 2, p), g_sum + row * C + col);
      }
    }
    async_copy::commit();
  };
  // The lane's column sums: [dw, db, drb][p][k], as the warp kernel's.
  A sums[kSums * kLanePacks * kPack] = {};
  auto sum_at = [&](int s, int p, int k) -> A& { return sums[(s * kLanePacks + p) * kPack + k]; };
  int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + warp;
  // mean and rstd of the next two rows, loaded as their rows are fetched.
  A mu_next = 0, rs_next = 0, mu_after = 0, rs_after = 0;
  if (row < rows) mu_next = mean[row], rs_next = rstd[row];
  if (row + stride < rows) mu_after = mean[row + stride], rs_after = rstd[row + stride];
  fetch(row, 0);
  fetch(row + stride, 1);
  for (int stage = 0; row < rows; row += stride, stage = stage == kStages - 1 ? 0 : stage + 1) {
    const A mu = mu_next, rs = rs_next;
    mu_next = mu_after, rs_next = rs_after;
    const int64_t ahead = row + 2 * stride;
    if (ahead < rows) mu_after = mean[ahead], rs_after = rstd[ahead];
    fetch(ahead, stage == 0 ? kStages - 1 : stage - 1);  // the stage the previous row left
    async_copy::wait<kStages - 1>();                     // this row's group is complete
    Pair<A> row_sums{0, 0};                              // sum dxhat, sum dxhat xhat
#pragma unroll
    for (int p = 0; p < kLanePacks; ++p) {
      if (column(p) >= C) continue;
      const Pack<T, kPack> xs = read(slot(stage, 0, p)), gs = read(slot(stage, 1, p));
      const Pack<P, kPack> w = load_pack<kPack>(weight + column(p));
#pragma unroll
      for (int k = 0; k < kPack; ++k) {
        const A xhat = warp_backward_math::normalized(convert_to<A>(xs.v[k]), mu, rs);
        warp_backward_math::add_row_terms(row_sums, xhat, convert_to<A>(gs.v[k]), convert_to<A>(w.v[k]));
      }
    }
    row_sums = warp_all_reduce(row_sums, SumOp{});
    const A mean_dxhat = row_sums.first / static_cast<A>(C), mean_dxhat_xhat = row_sums.second / static_cast<A>(C);
#pragma unroll
    for (int p = 0; p < kLanePacks; ++p) {
      const int64_t col = column(p);
      if (col >= C) continue;
      const Pack<T, kPack> xs = read(slot(stage, 0, p)), gs = read(slot(stage, 1, p));
      Pack<T, kPack> gs_sum;
      if (g_sum) gs_sum = read(slot(stage, 2, p));
      const Pack<P, kPack> w = load_pack<kPack>(weight + col);
      Pack<T, kPack> out;
#pragma unroll
      for (int k = 0; k < kPack; ++k) {
        const A xhat = warp_backward_math::normalized(convert_to<A>(xs.v[k]), mu, rs), gk = convert_to<A>(gs.v[k]);
        sum_at(0, p, k) = __fmaf_rn(gk, xhat, sum_at(0, p, k));
        sum_at(1, p, k) = __fadd_rn(sum_at(1, p, k), gk);
        const A unscaled =
            warp_backward_math::unscaled_input_gradient(xhat, gk, convert_to<A>(w.v[k]), mean_dxhat, mean_dxhat_xhat);
        const A d = g_sum ? __fmaf_rn(rs, unscaled, convert_to<A>(gs_sum.v[k])) : __fmul_rn(rs, unscaled);
        if constexpr (kResidualBias) sum_at(2, p, k) = __fadd_rn(sum_at(2, p, k), d);
        out.v[k] = convert_to<T>(d);
      }
      if (dx) store_pack<kPack>(dx + row * C + col, out);
      if (dr) store_pack<kPack>(dr + row * C + col, out);
    }
  }
  if (!partial_dw && !partial_db && !partial_drb) return;  // the same for every thread of the grid
  // The fold of fold_warps (layer_norm_backward_warp.cuh), all warps staged at once in the ring:
  // each (v, lane) total is 0 + warp 0's + warp 1's + ..., the same additions in the same order.
  constexpr int kValues = kSums * kLanePacks * kPack;
  static_assert(kValues * 32 * sizeof(A) <= kWarpBytes, "a warp's sums fit in its ring");
  async_copy::wait<0>();  // only empty groups are left; none may land in the sums
  __syncthreads();        // every warp has left its ring
  A* staged = reinterpret_cast<A*>(shared_words);
#pragma unroll
  for (int v = 0; v < kValues; ++v) staged[(warp * kValues + v) * 32 + lane] = sums[v];  // lane-fastest
  __syncthreads();
  for (int j = warp * 32 + lane; j < kValues * 32; j += kWarps * 32) {
    A total = 0;
    for (int w = 0; w < kWarps; ++w) total += staged[w * kValues * 32 + j];
    const int v = j / 32, owner = j % 32;
    const int s = v / (kLanePacks * kPack), p = v / kPack % kLanePacks, k = v % kPack;
    A* partial = s == 0 ? partial_dw : s == 1 ? partial_db : partial_drb;
    const int64_t col = static_cast<int64_t>(p * 32 + owner) * kPack + k;
    if (col < C && partial) partial[blockIdx.x * C + col] = total;
  }
}

}  // namespace precis::ops::cuda
