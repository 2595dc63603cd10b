// The two products of a GELU MLP with the GELU in their epilogue, on Hopper: a persistent,
// warp-specialized sm_90a kernel (TMA loads, wgmma, two consumer warpgroups in ping-pong) in
// place of cuBLASLt's GELU_AUX_BIAS and DGELU epilogues (ops/cuda/gemm_gelu_sm90.h says
// when). bf16 operands, f32 accumulators, bf16 results:
//   forward   pre = x W^T + bias,  out = gelu(pre)          x [M, K], W [N, K]: both K-major
//   backward  grad_pre = (grad_out W2) * gelu'(pre)         grad_out [M, K], W2 [K, N]: B is
//                                                           N-major (wgmma's transposed B)
// gelu and gelu' are the tanh approximation in f32 (ops/cuda/compute_math.cuh), applied to the
// f32 sum (forward: pre and out are both rounded from it) or to the bf16 pre (backward), as
// the unfused kernels of ops/cuda/matmul.cu do.
//
// Why: GPT-2's two GELU products (M = B T, N = 4C, K = C) write or read a second [M, N] bf16
// array beside the product. cuBLASLt's epilogue runs after a tile's main loop, so with K = 768
// (12 k-blocks of 64) the epilogue, with its extra bytes, is a large share of every tile. Here
// two consumer warpgroups each own a whole output tile and take turns on the tensor cores:
// while one runs its main loop, the other runs the epilogue of its previous tile (bias, GELU
// or GELU', stores), so the epilogue hides behind math (CUTLASS's
// KernelTmaWarpSpecializedPingpong does the same).
//
// The block: 3 warpgroups, 384 threads, one block per SM (persistent: as many blocks as the
// device holds at once). Blocks come in clusters of 2 (set_gemm_gelu_sm90_cluster; 1 also
// works): cluster q takes the cluster tiles q, q + clusters, ... of the row-major grid of
// 256 x 128 cluster tiles, and its block `rank` the 128 x 128 tile of rows 128 rank..; each
// block hands its tiles to its consumers in turn. Consecutive cluster tiles share rows of A,
// and all of W stays in L2.
//   warpgroup 0  the producer: one thread issues every TMA load (cp.async.bulk.tensor) into a
//                ring of kStages shared-memory stages, each one k-block (64) of the A tile
//                (128 x 64) and the B tile (128 x 64), 32 KiB, with a `full` mbarrier the loads
//                complete and an `empty` mbarrier the consumers arrive on when their wgmmas
//                have read the stage. The two blocks of a cluster need the same B tile: each
//                loads one half (64 of its 128 rows) into both (multicast), so a stage's `empty`
//                counts the consumers of both blocks. Backward only: the tile's pre (128 x 128
//                bf16, 32 KiB) into the consumer's own buffer, issued halfway through the
//                tile's k-blocks (its `pre_full` / `pre_empty` pair), so the epilogue reads it
//                from shared memory. setmaxnreg gives its registers to the consumers (40 left).
//   warpgroups 1, 2  the consumers: tile t of the block goes to consumer t % 2. Per k-block:
//                wait `full`, 4 k-steps x 2 m-halves of wgmma m64n128k16 (A and B from shared
//                memory), commit, wait for the previous k-block's group, release its stage.
//                The main loops alternate between the consumers through two named barriers
//                (bar.sync on its own, bar.arrive on the other's when its last wgmma is
//                issued), so the two never share the tensor cores and each epilogue overlaps
//                the other consumer's main loop.
//                The epilogue's stores (set_gemm_gelu_sm90_tma_store, default): the consumer
//                writes its bf16 results into its own 32 KiB shared tile (the layout of a
//                [128][64] TMA box pair, conflict-free 4-byte writes), fences them for the
//                copy engine, and one thread stores the tile by cp.async.bulk.tensor (whole
//                128-byte lines, asynchronous). Forward: pre goes out first and the GELU runs
//                in registers while the copy engine reads the tile, then gelu(pre) goes out
//                through the same tile; backward: grad_pre overwrites pre in the tile, which
//                goes back to the producer once the copy engine has read it. The other
//                epilogue stores each thread's bf16 pairs from registers: a warp's store then
//                covers 8 rows x 16 bytes, half of each 32-byte sector, and the forward stores
//                two arrays so.
// Tile 128 x 128 per consumer, by registers: 128 x 128 f32 accumulators over 128 threads are
// 128 registers a thread; a 128 x 256 tile would need 256, over the 255 a thread can have.
// With setmaxnreg 232 for consumers and 40 for the producer: 128 x 40 + 256 x 232 = 64,512 of
// the SM's 65,536 registers. Smem: a stage is (128 + 128) x 64 x 2 B = 32 KiB; the backward,
// and the forward with the shared-tile epilogue, keep 5 stages and the two consumers' tiles
// (160 + 64 = 224 KiB); the forward with register stores 6 stages (192 KiB); each + 1 KiB to
// start on a 1024-byte boundary, within the 227 KiB a block can have.
// A k-block is 2 x 128 x 128 x 64 = 2.1 MFLOP, ~512 clocks of an SM's tensor cores; 5-6
// stages keep ~1.5 us of loads in flight. A tile's main loop (K = 768) is ~6,100 clocks; the
// ping-pong hides an epilogue only while it is shorter. The epilogue's math (128 values a
// thread, a tanhf each: 2 MUFU ops, ~3,600 instructions a thread forward, ~4,600 backward)
// fits; register stores of 4 bytes a lane (128 a thread forward, 64 backward) go to L2 as
// half sectors and hold the warp (bench/NOTES.md), hence the shared-tile epilogue.
// Wider block tiles (set_gemm_gelu_sm90_tile, an experiment; struct Tiling): per flop, a wider
// wgmma reads fewer operand bytes from shared memory (A 64 x 16 and B N x 16 for 64 N 32 flops:
// 43, 48, 51 flops a byte at N = 128, 192, 256) and the block fewer bytes from L2 (with
// clusters of 2: 85, 110, 128 flops a byte for 128 x 128, 128 x 192, 128 x 256 tiles).
//   128 x 192, ping-pong as above: two m64n192k16 a k-step, 192 accumulators a thread (the
//     consumer's 232 registers hold them; ptxas spills a few loop scalars around the epilogue),
//     stages (128 + 192) x 64 x 2 = 40 KiB, 3 of them beside two 48 KiB tiles: 216 KiB.
//   128 x 256, cooperative: both consumers on every tile, consumer c its rows 64c.., one
//     m64n256k16 a k-step (128 accumulators), both reading the stage's B; a stage's `empty`
//     counts both consumers' warps; 48 KiB stages, 3 of them beside the two consumers' 32 KiB
//     tiles ([64][256] each, stored as [64][64] boxes): 208 KiB; the backward's pre (64 KiB)
//     fills both consumers' tiles under one pre_full / pre_empty pair (2 arrivals). Its
//     epilogue does not overlap math: the two consumers run it together while the tensor
//     cores wait (only the producer runs ahead, up to 3 stages into the next tile).
// Both have the shared-tile epilogue only.
// Why clusters: a 128 x 128 tile does 64 flops per byte it reads from L2 (2 x 128 x 128 x 64
// flops per 256 x 64 x 2 bytes), so 690 TFLOP/s would read ~10.8 TB/s from L2, ~47 bytes a
// clock an SM; with B shared, 192 rows a k-block instead of 256: 85 flops a byte, ~8.1 TB/s,
// what a 128 x 256 tile without clusters reads.
//
// Shared-memory layouts: every TMA load uses 128-byte swizzle and boxes of 64 16-bit values
// (128 bytes) a row, so each box is one "paneled" tile of ops/cuda/flash_wgmma.cuh (16-byte
// chunk c of row r at chunk c ^ (r % 8), 1024-byte aligned) and the wgmma descriptors are its
// k_major_descriptor / mn_major_descriptor:
//   A stage   [128 m][64 k], one box (k, m): k_major_descriptor<128>(rows 64h.., k-step ks)
//   B forward [128 n][64 k], two boxes (k, n0) and (k, n0 + 64) of 64 rows, 8 KiB apart:
//             k_major_descriptor<128>(rows 0.., ks)
//   B backward [64 k][128 n] as two [64 k][64 n] panels, boxes (n0, k) and (n0 + 64, k), 8 KiB
//             apart: mn_major_descriptor<64>(ks), leading byte offset 8 KiB between the panels
//   pre       [128 m][128 n] as two [128][64] panels, boxes (n0, m) and (n0 + 64, m); read
//             by the epilogue through panel_offset<128> (conflict-free: the 8 rows a warp reads
//             at once sit in 8 different 16-byte chunks).
// mbarrier phases: use u = g / kStages of stage g % kStages (g counts the block's k-blocks
// over all its tiles, in the same order for producer and consumers): consumers wait `full`
// with parity u & 1, the producer waits `empty` with parity (u & 1) ^ 1 (a fresh barrier's
// "previous phase", parity 1, counts as complete, so the first pass does not wait); the
// n-th pre tile of a consumer likewise with n & 1. With a cluster, a stage's `full` also
// counts the bytes the partner block multicasts into it: those may land before this block's
// producer arms it (the transaction count goes below zero; the phase still waits for the
// arrival), never a use early, since the partner waits for this block's consumers to have
// released the stage. A block leaves only after a cluster barrier, once its partner has no
// arrival left to make on its mbarriers.
//
// The code assembles only in the sm_90a pass (-gencode arch=compute_90a,code=sm_90a, set for
// this file in CMakeLists.txt); the other passes compile an empty kernel, and
// sm90a_code_loaded (ops/cuda/flash_attention_sm90.h) checks that the driver loaded the
// sm_90a code.
#include <cuda.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <string>

#include "core/cuda/launch.cuh"
#include "ops/cuda/bulk_copy.cuh"
#include "ops/cuda/compute_math.cuh"
#include "ops/cuda/flash_attention_sm90.h"
#include "ops/cuda/flash_wgmma.cuh"
#include "ops/cuda/gemm_gelu_sm90.h"
#include "ops/cuda/tensor_map.h"

namespace precis::ops::cuda {

using namespace precis::cuda;  // the device toolkit (core/cuda/)

namespace {

using flash::kSm90aPass;
using flash::kSwizzleAtomBytes;
using bf16 = __nv_bfloat16;

constexpr int kTileM = 128, kTileK = 64;
constexpr int kThreads = 384;  // the producer warpgroup and two consumers
constexpr int kProducerRegisters = 40, kConsumerRegisters = 232;
// Named barriers 1 and 2: consumer c may start a main loop (0 is __syncthreads'); 3 and 4:
// consumer c's own 128 threads (its epilogue's shared tile).
[[maybe_unused]] constexpr int kFirstTurnBarrier = 1, kFirstEpilogueBarrier = 3;

// The block tile, 128 x kTileN (set_gemm_gelu_sm90_tile). 128 and 192: each consumer its own
// tile (ping-pong), two m64nNk16 a k-step, 128 or 192 f32 accumulators a thread. 256: both
// consumers on every tile (cooperative), consumer c rows 64c..64c+63, one m64n256k16 a k-step,
// 128 accumulators; B (256 x 64 a k-block) read by both. A consumer keeps its results in a
// shared tile of [kRows][kN] bf16 as kN / 64 panels of [kRows][64] (32, 48, 32 KiB).
template <int kTileN>
struct Tiling {
  static_assert(kTileN == 128 || kTileN == 192 || kTileN == 256, "block tiles 128 x 128, 128 x 192, 128 x 256");
  static constexpr int kN = kTileN;  // the block tile's columns
  static constexpr bool kCooperative = kTileN == 256;
  static constexpr int kRows = kCooperative ? 64 : 128;  // a consumer's rows of a tile
  static constexpr int kHalves = kRows / 64;             // m64 wgmmas a k-step, a consumer
  static constexpr int kPanels = kN / 64;                // 64-column panels (TMA boxes) of a row of the tile
  static constexpr int kStageBytes = (kTileM + kN) * kTileK * 2;
  static constexpr int kTileBytes = kRows * kN * 2;
};

// kTmaStore: the epilogue writes its results into a shared tile of its consumer and the copy
// engine stores them (whole 128-byte lines); else each thread stores its bf16 pairs to global.
// The backward's shared tiles hold pre (read, then overwritten by grad_pre); the forward's
// hold pre, then gelu(pre); either way one 32 KiB tile a consumer, in place of a sixth stage.
// The wider tiles' stages are 40 KiB (192) and 48 KiB (256): 3 of them beside the two tiles,
// 216 and 208 KiB.
template <bool kBackward, bool kTmaStore, int kTileN>
struct Pipeline {
  using T = Tiling<kTileN>;
  static constexpr bool kTileBuffers = kBackward || kTmaStore;
  static constexpr int kStages = kTileN != 128 ? 3 : kTileBuffers ? 5 : 6;
  static constexpr int kPreBytes = kTileBuffers ? 2 * T::kTileBytes : 0;
  static constexpr int kSmemBytes = kStages * T::kStageBytes + kPreBytes + kSwizzleAtomBytes;
};
static_assert(Pipeline<true, true, 128>::kSmemBytes <= 227 * 1024 - 128 &&
                  Pipeline<false, false, 128>::kSmemBytes <= 227 * 1024 - 128 &&
                  Pipeline<true, true, 192>::kSmemBytes <= 227 * 1024 - 128 &&
                  Pipeline<true, true, 256>::kSmemBytes <= 227 * 1024 - 128,
              "a block's shared memory, with its mbarriers");
// What the epilogue writes. out: dense [m, n] (forward: gelu(pre); backward: grad_pre).
struct Epilogue {
  bf16* out;
  bf16* pre;         // forward: x W^T + bias, row stride pre_ld
  const bf16* bias;  // forward, [n]; or null
  int64_t pre_ld;
  int m, n, k;
  // 1; 0 (set_gemm_gelu_sm90_timing_without_gelu, timing only: wrong results) skips gelu and
  // gelu' in the shared-tile epilogues, to time the kernel without the epilogue's math.
  int gelu;
};

[[maybe_unused]] __device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
[[maybe_unused]] __device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// The registers of every thread of this warpgroup become kRegisters (all 128 threads execute it).
template <int kRegisters>
__device__ __forceinline__ void lower_registers_to() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}
template <int kRegisters>
__device__ __forceinline__ void raise_registers_to() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}

__device__ __forceinline__ void store_pair(bf16* p, float lo, float hi) {
  *reinterpret_cast<uint32_t*>(p) = flash::pack2<bf16>(lo, hi);
}

// This block's tiles, the same sequence for its producer and consumers: cluster tile
// ct = cluster, cluster + clusters, ... of the row-major grid of (kCluster x 128) x kN cluster
// tiles; CTA `rank` of the cluster takes its rank-th 128-row tile.
template <int kCluster, int kTileN>
struct TileSequence {
  static constexpr int kN = Tiling<kTileN>::kN;
  int tiles_n, cluster_tiles, first, step, rank;
  __device__ __forceinline__ explicit TileSequence(const Epilogue& e, uint32_t cta_rank)
      : tiles_n(e.n / kN),
        cluster_tiles(e.m / (kTileM * kCluster) * (e.n / kN)),
        first(blockIdx.x / kCluster),
        step(gridDim.x / kCluster),
        rank(static_cast<int>(cta_rank)) {}
  __device__ __forceinline__ int m0(int ct) const { return (ct / tiles_n * kCluster + rank) * kTileM; }
  __device__ __forceinline__ int n0(int ct) const { return ct % tiles_n * kN; }
};

// The shared tile that holds tile `local` of this block's pre (backward) and its pre_full /
// pre_empty pair: ping-pong, consumer local % 2's own, its (local / 2)-th use; cooperative
// (128 x 256), the pair of both consumers' tiles (consumer c's at c x 32 KiB), its local-th use.
template <int kTileN>
__device__ __forceinline__ int pre_buffer(int local) {
  return Tiling<kTileN>::kCooperative ? 0 : local & 1;
}
template <int kTileN>
__device__ __forceinline__ int pre_use(int local) {
  return Tiling<kTileN>::kCooperative ? local : local >> 1;
}

// The producer (one thread): every k-block of every tile of this block into the ring, and
// (backward) each tile's pre into its consumers' buffers. With a cluster of 2 the two CTAs
// share B: each loads its half (64 or 128 of the product's columns) into both.
template <bool kBackward, bool kTmaStore, int kCluster, int kTileN>
__device__ __forceinline__ void produce(uint8_t* smem, uint64_t* full, uint64_t* empty, uint64_t* pre_full,
                                        uint64_t* pre_empty, const CUtensorMap* a_map, const CUtensorMap* b_map,
                                        const CUtensorMap* pre_map, const Epilogue& e, uint32_t cta_rank) {
  using P = Pipeline<kBackward, kTmaStore, kTileN>;
  using T = Tiling<kTileN>;
  prefetch_tensor_map(a_map);
  prefetch_tensor_map(b_map);
  if constexpr (kBackward) prefetch_tensor_map(pre_map);
  const TileSequence<kCluster, kTileN> seq(e, cta_rank);
  const int k_blocks = e.k / kTileK;
  int g = 0;
  for (int local = 0, ct = seq.first; ct < seq.cluster_tiles; ++local, ct += seq.step) {
    const int m0 = seq.m0(ct), n0 = seq.n0(ct);
    for (int kb = 0; kb < k_blocks; ++kb, ++g) {
      const int s = g % P::kStages;
      mbarrier_wait(&empty[s], ((g / P::kStages) & 1) ^ 1);  // free in every CTA of the cluster
      uint8_t* a_tile = smem + s * T::kStageBytes;
      uint8_t* b_tile = a_tile + kTileM * kTileK * 2;
      mbarrier_arrive_expect_bytes(&full[s], T::kStageBytes);
      tensor_copy_2d_to_shared(a_tile, a_map, kb * kTileK, m0, &full[s]);
      // B in panels of 64 product columns, 8 KiB each: forward rows n0 + 64 p of the K-major
      // [kN][64] tile, backward the [64 k][64 n] panel p of the MN-major tile.
      auto load_b_panel = [&](int p, auto copy) {
        if constexpr (kBackward)
          copy(b_tile + p * kTileK * 64 * 2, n0 + 64 * p, kb * kTileK);
        else
          copy(b_tile + p * 64 * kTileK * 2, kb * kTileK, n0 + 64 * p);
      };
      if constexpr (kCluster == 2) {
        for (int p = seq.rank * T::kPanels / 2; p < (seq.rank + 1) * T::kPanels / 2; ++p)
          load_b_panel(
              p, [&](uint8_t* dst, int c0, int c1) { tensor_copy_2d_to_cluster(dst, b_map, c0, c1, &full[s], 0b11); });
      } else {
        for (int p = 0; p < T::kPanels; ++p)
          load_b_panel(p,
                       [&](uint8_t* dst, int c0, int c1) { tensor_copy_2d_to_shared(dst, b_map, c0, c1, &full[s]); });
      }
      if constexpr (kBackward) {
        if (kb == k_blocks / 2) {
          const int c = pre_buffer<kTileN>(local), n = pre_use<kTileN>(local);
          uint8_t* pre_tile = smem + P::kStages * T::kStageBytes + c * T::kTileBytes;
          mbarrier_wait(&pre_empty[c], (n & 1) ^ 1);
          mbarrier_arrive_expect_bytes(&pre_full[c], kTileM * T::kN * 2);
          // Boxes of [kRows m][64 n]: consumer q's rows, panel p (cooperative: both consumers' tiles).
          for (int q = 0; q < kTileM / T::kRows; ++q)
            for (int p = 0; p < T::kPanels; ++p)
              tensor_copy_2d_to_shared(pre_tile + q * T::kTileBytes + p * T::kRows * 64 * 2, pre_map, n0 + 64 * p,
                                       m0 + q * T::kRows, &pre_full[c]);
        }
      }
    }
  }
}

// The register epilogues (kTmaStore false, 128 x 128 tile only). Thread layout of the
// accumulators: ops/cuda/flash_wgmma.cuh (acc[h] holds rows 64h..64h+63 of the tile).
[[maybe_unused]] __device__ __forceinline__ void bias_gelu_epilogue(const float (&acc)[2][128 / 2], int m0, int n0,
                                                                    const Epilogue& e) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32 % 4;
  const int row0 = m0 + 16 * warp + lane / 4, col0 = n0 + 2 * (lane % 4);
#pragma unroll
  for (int j = 0; j < 128 / 8; ++j) {
    const int col = col0 + 8 * j;
    float2 b = make_float2(0.0f, 0.0f);
    if (e.bias != nullptr) b = flash::unpack2<bf16>(__ldg(reinterpret_cast<const unsigned int*>(e.bias + col)));
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int64_t row = row0 + 64 * h + 8 * r;
        const float z0 = acc[h][4 * j + 2 * r] + b.x, z1 = acc[h][4 * j + 2 * r + 1] + b.y;
        store_pair(e.pre + row * e.pre_ld + col, z0, z1);
        store_pair(e.out + row * e.n + col, gelu_tanh(z0), gelu_tanh(z1));
      }
  }
}

// Backward epilogue: grad_pre = acc * gelu'(pre), pre from this consumer's shared tile.
[[maybe_unused]] __device__ __forceinline__ void gelu_grad_epilogue(const float (&acc)[2][128 / 2],
                                                                    const bf16* pre_tile, int m0, int n0,
                                                                    const Epilogue& e) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32 % 4;
  const int local_row0 = 16 * warp + lane / 4, local_col0 = 2 * (lane % 4);
#pragma unroll
  for (int j = 0; j < 128 / 8; ++j)
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int local_row = local_row0 + 64 * h + 8 * r, local_col = local_col0 + 8 * j;
        const float2 z = flash::unpack2<bf16>(
            *reinterpret_cast<const uint32_t*>(pre_tile + flash::panel_offset<kTileM>(local_row, local_col)));
        const int64_t row = m0 + local_row;
        store_pair(e.out + row * e.n + n0 + local_col, acc[h][4 * j + 2 * r] * gelu_tanh_grad(z.x),
                   acc[h][4 * j + 2 * r + 1] * gelu_tanh_grad(z.y));
      }
}

// The shared-tile epilogues (kTmaStore). `tile` is consumer c's [kRows m][kN n] bf16 tile as
// kN / 64 panels of [kRows][64] with 128-byte swizzle, the layout of the copy engine's boxes
// (n0 + 64 p, m0c): a warp's 4-byte writes (8 rows, 16 bytes each) hit 8 different 16-byte
// chunks of the 128 bytes of banks, no conflict. m0c: the consumer's first row of the product.
template <int kTileN>
__device__ __forceinline__ uint32_t* tile_pair(bf16* tile, int local_row, int local_col) {
  return reinterpret_cast<uint32_t*>(tile + flash::panel_offset<Tiling<kTileN>::kRows>(local_row, local_col));
}

// Stores consumer c's tile to `map` at (n0, m0c) once all its 128 threads have written it; one
// thread issues the copies.
template <int kTileN>
__device__ __forceinline__ void store_tile(const CUtensorMap* map, const bf16* tile, int m0c, int n0, int c) {
  using T = Tiling<kTileN>;
  fence_shared_to_async_proxy();
  named_barrier_sync(kFirstEpilogueBarrier + c, 128);
  if (threadIdx.x % 128 == 0) {
#pragma unroll
    for (int p = 0; p < T::kPanels; ++p) tensor_store_2d_from_shared(map, n0 + 64 * p, m0c, tile + p * T::kRows * 64);
    bulk_store_commit();
  }
}

// Waits until the copy engine has read consumer c's tile (its last store), so it may be written.
__device__ __forceinline__ void wait_tile_read(int c) {
  if (threadIdx.x % 128 == 0) bulk_store_wait_read<0>();
  named_barrier_sync(kFirstEpilogueBarrier + c, 128);
}

// Forward, shared tile: pre = acc + bias written to the tile and stored; while the copy engine
// reads it, gelu in registers; then gelu(pre) into the tile and stored. The same values as
// bias_gelu_epilogue (the f32 sum rounded once, gelu of the f32 sum).
template <int kTileN>
__device__ __forceinline__ void bias_gelu_epilogue_tma(float (&acc)[Tiling<kTileN>::kHalves][Tiling<kTileN>::kN / 2],
                                                       bf16* tile, int m0c, int n0, const Epilogue& e,
                                                       const CUtensorMap* pre_map, const CUtensorMap* out_map, int c) {
  using T = Tiling<kTileN>;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32 % 4;
  const int local_row0 = 16 * warp + lane / 4, local_col0 = 2 * (lane % 4);
  auto write_tile = [&]() {
#pragma unroll
    for (int j = 0; j < T::kN / 8; ++j)
#pragma unroll
      for (int h = 0; h < T::kHalves; ++h)
#pragma unroll
        for (int r = 0; r < 2; ++r)
          *tile_pair<kTileN>(tile, local_row0 + 64 * h + 8 * r, local_col0 + 8 * j) =
              flash::pack2<bf16>(acc[h][4 * j + 2 * r], acc[h][4 * j + 2 * r + 1]);
  };
  if (e.bias != nullptr) {
#pragma unroll
    for (int j = 0; j < T::kN / 8; ++j) {
      const float2 b =
          flash::unpack2<bf16>(__ldg(reinterpret_cast<const unsigned int*>(e.bias + n0 + local_col0 + 8 * j)));
#pragma unroll
      for (int h = 0; h < T::kHalves; ++h)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          acc[h][4 * j + 2 * r] += b.x;
          acc[h][4 * j + 2 * r + 1] += b.y;
        }
    }
  }
  wait_tile_read(c);  // the previous tile's gelu stored
  write_tile();
  store_tile<kTileN>(pre_map, tile, m0c, n0, c);
  if (e.gelu) {
#pragma unroll
    for (int h = 0; h < T::kHalves; ++h)
#pragma unroll
      for (int i = 0; i < T::kN / 2; ++i) acc[h][i] = gelu_tanh(acc[h][i]);
  }
  wait_tile_read(c);  // pre stored
  write_tile();
  store_tile<kTileN>(out_map, tile, m0c, n0, c);
}

// Backward, shared tile: grad_pre over pre in the tile (each thread rewrites the pairs it
// read), then stored; the tile goes back to the producer once the copy engine has read it.
template <int kTileN>
__device__ __forceinline__ void gelu_grad_epilogue_tma(
    const float (&acc)[Tiling<kTileN>::kHalves][Tiling<kTileN>::kN / 2], bf16* pre_tile, int m0c, int n0,
    const CUtensorMap* out_map, uint64_t* pre_empty, int c, bool gelu) {
  using T = Tiling<kTileN>;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32 % 4;
  const int local_row0 = 16 * warp + lane / 4, local_col0 = 2 * (lane % 4);
  auto rewrite = [&](auto grad) {
#pragma unroll
    for (int j = 0; j < T::kN / 8; ++j)
#pragma unroll
      for (int h = 0; h < T::kHalves; ++h)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          uint32_t* pair = tile_pair<kTileN>(pre_tile, local_row0 + 64 * h + 8 * r, local_col0 + 8 * j);
          const float2 z = flash::unpack2<bf16>(*pair);
          *pair = flash::pack2<bf16>(acc[h][4 * j + 2 * r] * grad(z.x), acc[h][4 * j + 2 * r + 1] * grad(z.y));
        }
  };
  if (gelu)
    rewrite([](float z) { return gelu_tanh_grad(z); });
  else
    rewrite([](float) { return 1.0f; });  // timing only
  store_tile<kTileN>(out_map, pre_tile, m0c, n0, c);
  if (threadIdx.x % 128 == 0) {
    bulk_store_wait_read<0>();
    mbarrier_arrive(pre_empty);
  }
}

// Consumer c (0 or 1): ping-pong (128 x 128, 128 x 192), the tiles local = c, c + 2, ... of this
// block, in turns with the other consumer; cooperative (128 x 256), rows 64c..64c+63 of every
// tile of this block, beside the other.
template <bool kBackward, bool kTmaStore, int kCluster, int kTileN>
__device__ __forceinline__ void consume(int c, uint8_t* smem, uint64_t* full, uint64_t* empty, uint64_t* pre_full,
                                        uint64_t* pre_empty, const CUtensorMap* pre_map, const CUtensorMap* out_map,
                                        const Epilogue& e, uint32_t cta_rank) {
  using P = Pipeline<kBackward, kTmaStore, kTileN>;
  using T = Tiling<kTileN>;
  static_assert(kTmaStore || kTileN == 128, "the wider tiles have the shared-tile epilogue only");
  constexpr bool kCoop = T::kCooperative;  // 128 x 256: both consumers on every tile
  const int lane = threadIdx.x % 32;
  const TileSequence<kCluster, kTileN> seq(e, cta_rank);
  const int k_blocks = e.k / kTileK;
  // A stage goes back to the producers of every CTA that wrote into it.
  auto release = [&](int g) {
    if (lane != 0) return;
    if constexpr (kCluster == 2) {
      mbarrier_arrive_in_cta(&empty[g % P::kStages], 0);
      mbarrier_arrive_in_cta(&empty[g % P::kStages], 1);
    } else {
      mbarrier_arrive(&empty[g % P::kStages]);
    }
  };
  constexpr int kFirst = kCoop ? 0 : 1, kStep = kCoop ? 1 : 2;  // this consumer's tiles of the block's
  float acc[T::kHalves][T::kN / 2];
  for (int local = kFirst * c, ct = seq.first + kFirst * c * seq.step; ct < seq.cluster_tiles;
       local += kStep, ct += kStep * seq.step) {
    const int m0 = seq.m0(ct), n0 = seq.n0(ct);
    if constexpr (!kCoop)
      if (local > 0) named_barrier_sync(kFirstTurnBarrier + c, 256);  // the other consumer's main loop is issued
    const int g0 = local * k_blocks;
    for (int kb = 0; kb < k_blocks; ++kb) {
      const int g = g0 + kb, s = g % P::kStages;
      mbarrier_wait(&full[s], (g / P::kStages) & 1);
      const uint8_t* a_tile = smem + s * T::kStageBytes;
      const uint8_t* b_tile = a_tile + kTileM * kTileK * 2;
      flash::wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < kTileK / 16; ++ks)
#pragma unroll
        for (int h = 0; h < T::kHalves; ++h) {
          const uint64_t a_desc = flash::k_major_descriptor<kTileM>(a_tile, (kCoop ? 64 * c : 64 * h), ks);
          const int accumulate = kb > 0 || ks > 0;
          if constexpr (kBackward)
            flash::wgmma_smem_smem_b_transposed<bf16, T::kN>(
                acc[h], a_desc, flash::mn_major_descriptor<kTileK>(b_tile, ks), accumulate);
          else
            flash::wgmma_smem_smem<bf16, T::kN>(acc[h], a_desc, flash::k_major_descriptor<T::kN>(b_tile, 0, ks),
                                                accumulate);
        }
      flash::wgmma_commit();
      if (kb > 0) {
        flash::wgmma_wait<1>();  // k-block kb - 1 has been read: its stage goes back
        release(g - 1);
      }
    }
    // The other consumer's turn, where it has a next tile (every bar.arrive meets a bar.sync).
    if constexpr (!kCoop)
      if (ct + seq.step < seq.cluster_tiles) named_barrier_arrive(kFirstTurnBarrier + (1 - c), 256);
    flash::wgmma_wait<0>();
#pragma unroll
    for (int h = 0; h < T::kHalves; ++h) flash::fence_registers(acc[h]);
    release(g0 + k_blocks - 1);

    const int m0c = kCoop ? m0 + 64 * c : m0;  // this consumer's first row
    bf16* tile = reinterpret_cast<bf16*>(smem + P::kStages * T::kStageBytes + c * T::kTileBytes);  // kTileBuffers
    if constexpr (kBackward) {
      const int buffer = pre_buffer<kTileN>(local);
      mbarrier_wait(&pre_full[buffer], pre_use<kTileN>(local) & 1);
      if constexpr (kTmaStore) {
        gelu_grad_epilogue_tma<kTileN>(acc, tile, m0c, n0, out_map, &pre_empty[buffer], c, e.gelu != 0);
      } else {
        gelu_grad_epilogue(acc, tile, m0, n0, e);
        __syncwarp();
        if (lane == 0) mbarrier_arrive(&pre_empty[c]);
      }
    } else if constexpr (kTmaStore) {
      bias_gelu_epilogue_tma<kTileN>(acc, tile, m0c, n0, e, pre_map, out_map, c);
    } else {
      bias_gelu_epilogue(acc, m0, n0, e);
    }
  }
  if constexpr (kTmaStore)
    if (threadIdx.x % 128 == 0) bulk_store_wait_all();  // the last tile's stores written before the block leaves
}

template <bool kBackward, bool kTmaStore, int kCluster, int kTileN>
__global__ void __launch_bounds__(kThreads, 1)
    gemm_gelu_sm90_kernel(const __grid_constant__ CUtensorMap a_map, const __grid_constant__ CUtensorMap b_map,
                          const __grid_constant__ CUtensorMap pre_map, const __grid_constant__ CUtensorMap out_map,
                          const Epilogue e) {
  precis::cuda::wait_for_previous_grid();  // no early trigger: the next kernel's blocks could not fit beside ours
  if constexpr (kSm90aPass) {
    using P = Pipeline<kBackward, kTmaStore, kTileN>;
    extern __shared__ __align__(16) uint8_t gemm_gelu_smem[];
    __shared__ uint64_t full[P::kStages], empty[P::kStages], pre_full[2], pre_empty[2];
    uint8_t* smem =
        gemm_gelu_smem + (kSwizzleAtomBytes - smem_address(gemm_gelu_smem) % kSwizzleAtomBytes) % kSwizzleAtomBytes;
    const uint32_t cta_rank = kCluster == 2 ? cluster_cta_rank() : 0;
    if (threadIdx.x == 0) {
      for (int s = 0; s < P::kStages; ++s) {
        mbarrier_init(&full[s], 1);  // the producer's arrive.expect_tx
        // One lane of each consumer warp of each CTA it feeds (cooperative: both consumers read it).
        mbarrier_init(&empty[s], (Tiling<kTileN>::kCooperative ? 8 : 4) * kCluster);
      }
      for (int c = 0; c < 2; ++c) {
        mbarrier_init(&pre_full[c], 1);
        // The storing thread of its consumer (cooperative: of both), or one lane a warp.
        mbarrier_init(&pre_empty[c], kTmaStore ? (Tiling<kTileN>::kCooperative ? 2 : 1) : 4);
      }
      fence_mbarrier_init();
    }
    if constexpr (kCluster == 2)
      cluster_sync();  // the peer's copies and arrivals find these barriers initialised
    else
      __syncthreads();
    const int warpgroup = threadIdx.x / 128;
    if (warpgroup == 0) {
      lower_registers_to<kProducerRegisters>();
      if (threadIdx.x == 0)
        produce<kBackward, kTmaStore, kCluster, kTileN>(smem, full, empty, pre_full, pre_empty, &a_map, &b_map,
                                                        &pre_map, e, cta_rank);
    } else {
      raise_registers_to<kConsumerRegisters>();
      consume<kBackward, kTmaStore, kCluster, kTileN>(warpgroup - 1, smem, full, empty, pre_full, pre_empty, &pre_map,
                                                      &out_map, e, cta_rank);
    }
    // No CTA leaves while its peer may still arrive on its barriers (the copies into it were
    // all waited for by its own consumers).
    if constexpr (kCluster == 2) cluster_sync();
  }
}

// ---- host side

// A row-major [rows, cols] bf16 matrix with row stride ld (elements), in boxes of
// [box_rows][box_cols] with 128-byte swizzle.
CUtensorMap tensor_map_of(const void* base, int64_t rows, int64_t cols, int64_t ld, uint32_t box_rows,
                          uint32_t box_cols, const char* op) {
  CUtensorMap map;
  const uint64_t sizes[2] = {static_cast<uint64_t>(cols), static_cast<uint64_t>(rows)};
  const uint64_t byte_strides[1] = {static_cast<uint64_t>(ld) * 2};
  const uint32_t box[2] = {box_cols, box_rows};
  PRECIS_CHECK(encode_tiled_tensor_map(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, base, 2, sizes, byte_strides, box,
                                       CU_TENSOR_MAP_SWIZZLE_128B),
               op, ": the driver could not describe a [", rows, ", ", cols, "] matrix (row stride ", ld,
               ") as a tensor map");
  return map;
}

bool aligned16(const Tensor& t) { return reinterpret_cast<uintptr_t>(t.raw_data()) % 16 == 0; }

// A 2-D bf16 CUDA tensor of `shape` with unit column stride and a row stride that is a
// multiple of 8 elements (16 bytes), at a 16-byte aligned address.
bool tma_readable(const Tensor& t, const Shape& shape) {
  return t.defined() && t.is_cuda() && t.dtype() == DType::bf16 && t.shape() == shape && t.strides()[1] == 1 &&
         t.strides()[0] >= shape[1] && t.strides()[0] % 8 == 0 && aligned16(t);
}

// N a multiple of 128, or of the block tile's columns that the setting asks for.
bool tiles_fit(int64_t M, int64_t N, int64_t K) {
  const bool columns_fit = N % 128 == 0 || N % gemm_gelu_sm90_tile() == 0;
  return M > 0 && N > 0 && K > 0 && M % kTileM == 0 && columns_fit && K % kTileK == 0 && M < (int64_t{1} << 31) &&
         N < (int64_t{1} << 31) && K < (int64_t{1} << 31);
}

std::atomic<int> g_cluster{0};     // 1 or 2; 0 until set or read from the environment
std::atomic<int> g_tma_store{-1};  // 0 or 1; -1 until set or read from the environment
std::atomic<bool> g_timing_without_gelu{false};
std::atomic<int> g_tile_n{0};  // 128, 192 or 256; 0 until set or read from the environment

// The block tile's columns: the setting's where N is a multiple of them, else 128.
int tile_columns(int64_t N) {
  const int columns = gemm_gelu_sm90_tile();
  return N % columns == 0 ? columns : 128;
}
// The rows of pre's and out's boxes for the shared-tile epilogue: a consumer's rows of a tile.
uint32_t epilogue_box_rows(int tile_n) { return tile_n == 256 ? Tiling<256>::kRows : Tiling<128>::kRows; }

// The blocks of the persistent grid: one per SM, or, with clusters of 2, two per cluster that
// the device can hold at once (a GPC may leave an SM without a partner); at most one per tile.
template <bool kBackward, bool kTmaStore, int kCluster, int kTileN>
int persistent_blocks(Device device, int tiles, const char* op) {
  static std::array<std::atomic<int>, 64> known{};  // clusters at once, per device index; 0 not asked yet
  int clusters = multiprocessor_count(device) / kCluster;
  if constexpr (kCluster > 1) {
    const int index = device.index;
    clusters = index >= 0 && index < static_cast<int>(known.size()) ? known[index].load() : 0;
    if (clusters == 0) {
      cudaLaunchAttribute attribute{};
      attribute.id = cudaLaunchAttributeClusterDimension;
      attribute.val.clusterDim.x = kCluster;
      attribute.val.clusterDim.y = 1;
      attribute.val.clusterDim.z = 1;
      cudaLaunchConfig_t config{};
      config.gridDim = dim3(kCluster * (multiprocessor_count(device) / kCluster));
      config.blockDim = dim3(kThreads);
      config.dynamicSmemBytes = Pipeline<kBackward, kTmaStore, kTileN>::kSmemBytes;
      config.attrs = &attribute;
      config.numAttrs = 1;
      PRECIS_CUDA_CHECK(cudaOccupancyMaxActiveClusters(
                            &clusters, gemm_gelu_sm90_kernel<kBackward, kTmaStore, kCluster, kTileN>, &config),
                        op);
      PRECIS_CHECK(clusters > 0, op, ": the device holds no cluster of ", kCluster, " blocks of this kernel");
      if (index >= 0 && index < static_cast<int>(known.size())) known[index].store(clusters);
      if (kCluster * clusters < multiprocessor_count(device))  // a measurement should know
        std::cerr << "note: " << op << ": clusters of " << kCluster << " blocks use " << kCluster * clusters << " of "
                  << multiprocessor_count(device) << " SMs\n";
    }
  }
  return kCluster * std::min(tiles / kCluster, clusters);
}

template <bool kBackward, bool kTmaStore, int kCluster, int kTileN>
void launch_gemm_gelu(const CUtensorMap& a_map, const CUtensorMap& b_map, const CUtensorMap& pre_map,
                      const CUtensorMap& out_map, const Epilogue& e, Device device, const char* op) {
  auto kernel = gemm_gelu_sm90_kernel<kBackward, kTmaStore, kCluster, kTileN>;
  constexpr int kSmemBytes = Pipeline<kBackward, kTmaStore, kTileN>::kSmemBytes;
  set_device(device);
  // The occupancy query of persistent_blocks needs the kernel's shared memory allowed first.
  PRECIS_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes), op);
  const dim3 grid(
      persistent_blocks<kBackward, kTmaStore, kCluster, kTileN>(device, e.m / kTileM * (e.n / Tiling<kTileN>::kN), op));
  if constexpr (kCluster > 1)
    launch_clusters_with_shared_memory(kernel, grid, kThreads, kSmemBytes, kCluster, compute_stream(device), op, a_map,
                                       b_map, pre_map, out_map, e);
  else
    launch_with_shared_memory(kernel, grid, kThreads, kSmemBytes, compute_stream(device), op, a_map, b_map, pre_map,
                              out_map, e);
  PRECIS_CUDA_CHECK_LAUNCH(op);
}

// Clusters of 2 (B shared) where the rows pair up and the setting asks for them, else 1; the
// tile (tile_columns) and the epilogue the settings ask for (the wider tiles have the
// shared-tile epilogue only). pre_map and out_map are in boxes of [kRows][64] of the tile chosen.
template <bool kBackward, bool kTmaStore, int kTileN>
void launch_gemm_gelu(const CUtensorMap& a_map, const CUtensorMap& b_map, const CUtensorMap& pre_map,
                      const CUtensorMap& out_map, const Epilogue& e, Device device, const char* op) {
  if (gemm_gelu_sm90_cluster() == 2 && e.m % (2 * kTileM) == 0)
    launch_gemm_gelu<kBackward, kTmaStore, 2, kTileN>(a_map, b_map, pre_map, out_map, e, device, op);
  else
    launch_gemm_gelu<kBackward, kTmaStore, 1, kTileN>(a_map, b_map, pre_map, out_map, e, device, op);
}
template <bool kBackward>
void launch_gemm_gelu(const CUtensorMap& a_map, const CUtensorMap& b_map, const CUtensorMap& pre_map,
                      const CUtensorMap& out_map, const Epilogue& e, int tile_n, Device device, const char* op) {
  if (tile_n == 256)
    launch_gemm_gelu<kBackward, true, 256>(a_map, b_map, pre_map, out_map, e, device, op);
  else if (tile_n == 192)
    launch_gemm_gelu<kBackward, true, 192>(a_map, b_map, pre_map, out_map, e, device, op);
  else if (gemm_gelu_sm90_tma_store())
    launch_gemm_gelu<kBackward, true, 128>(a_map, b_map, pre_map, out_map, e, device, op);
  else
    launch_gemm_gelu<kBackward, false, 128>(a_map, b_map, pre_map, out_map, e, device, op);
}

}  // namespace

bool linear_gelu_sm90_supported(const Tensor& out, const Tensor& x, const Tensor& weight, const Tensor& bias,
                                const Tensor& pre) {
  if (!x.defined() || x.dim() != 2 || !weight.defined() || weight.dim() != 2) return false;
  const int64_t M = x.shape()[0], K = x.shape()[1], N = weight.shape()[0];
  if (!tiles_fit(M, N, K) || !tma_readable(x, {M, K}) || !tma_readable(weight, {N, K}) || !tma_readable(pre, {M, N}))
    return false;
  if (!out.defined() || out.dtype() != DType::bf16 || out.shape() != Shape({M, N}) || !out.is_contiguous() ||
      !aligned16(out))
    return false;
  if (bias.defined() &&
      (bias.dtype() != DType::bf16 || bias.shape() != Shape({N}) || !bias.is_contiguous() || !aligned16(bias)))
    return false;
  const Device device = x.device();
  for (const Tensor* t : {&out, &weight, &bias, &pre})
    if (t->defined() && t->device() != device) return false;
  return sm90a_code_loaded(device);
}

void linear_gelu_sm90(const Tensor& out, const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& pre) {
  const char* op = "linear_gelu (sm_90a)";
  PRECIS_CHECK(linear_gelu_sm90_supported(out, x, weight, bias, pre), op,
               ": needs bf16 operands on a compute-capability 9.0 GPU in the shapes and strides of "
               "ops/cuda/gemm_gelu_sm90.h");
  const int64_t M = x.shape()[0], K = x.shape()[1], N = weight.shape()[0];
  const CUtensorMap a_map = tensor_map_of(x.raw_data(), M, K, x.strides()[0], kTileM, kTileK, op);
  const CUtensorMap b_map = tensor_map_of(weight.raw_data(), N, K, weight.strides()[0], 64, kTileK, op);
  const Epilogue e{static_cast<bf16*>(out.raw_data()),
                   static_cast<bf16*>(pre.raw_data()),
                   bias.defined() ? static_cast<const bf16*>(bias.raw_data()) : nullptr,
                   pre.strides()[0],
                   static_cast<int>(M),
                   static_cast<int>(N),
                   static_cast<int>(K),
                   g_timing_without_gelu.load() ? 0 : 1};
  // [kRows m][64 n] boxes of pre and out for the shared-tile epilogue.
  const int tile_n = tile_columns(N);
  const uint32_t rows = epilogue_box_rows(tile_n);
  const CUtensorMap pre_map = tensor_map_of(pre.raw_data(), M, N, pre.strides()[0], rows, 64, op);
  const CUtensorMap out_map = tensor_map_of(out.raw_data(), M, N, N, rows, 64, op);
  launch_gemm_gelu<false>(a_map, b_map, pre_map, out_map, e, tile_n, x.device(), op);
}

bool linear_gelu_input_backward_sm90_supported(const Tensor& grad_pre, const Tensor& grad_out, const Tensor& weight,
                                               const Tensor& pre) {
  if (!grad_out.defined() || grad_out.dim() != 2 || !weight.defined() || weight.dim() != 2) return false;
  const int64_t M = grad_out.shape()[0], K = grad_out.shape()[1], N = weight.shape()[1];
  if (!tiles_fit(M, N, K) || !tma_readable(grad_out, {M, K}) || !tma_readable(weight, {K, N}) ||
      !tma_readable(pre, {M, N}))
    return false;
  if (!grad_pre.defined() || grad_pre.dtype() != DType::bf16 || grad_pre.shape() != Shape({M, N}) ||
      !grad_pre.is_contiguous() || !aligned16(grad_pre))
    return false;
  const Device device = grad_out.device();
  for (const Tensor* t : {&grad_pre, &weight, &pre})
    if (t->device() != device) return false;
  return sm90a_code_loaded(device);
}

void linear_gelu_input_backward_sm90(const Tensor& grad_pre, const Tensor& grad_out, const Tensor& weight,
                                     const Tensor& pre) {
  const char* op = "linear_gelu backward (sm_90a)";
  PRECIS_CHECK(linear_gelu_input_backward_sm90_supported(grad_pre, grad_out, weight, pre), op,
               ": needs bf16 operands on a compute-capability 9.0 GPU in the shapes and strides of "
               "ops/cuda/gemm_gelu_sm90.h");
  const int64_t M = grad_out.shape()[0], K = grad_out.shape()[1], N = weight.shape()[1];
  const CUtensorMap a_map = tensor_map_of(grad_out.raw_data(), M, K, grad_out.strides()[0], kTileM, kTileK, op);
  const CUtensorMap b_map = tensor_map_of(weight.raw_data(), K, N, weight.strides()[0], kTileK, 64, op);
  const int tile_n = tile_columns(N);
  const uint32_t rows = epilogue_box_rows(tile_n);
  const CUtensorMap pre_map = tensor_map_of(pre.raw_data(), M, N, pre.strides()[0], rows, 64, op);
  const Epilogue e{static_cast<bf16*>(grad_pre.raw_data()),
                   nullptr,
                   nullptr,
                   pre.strides()[0],
                   static_cast<int>(M),
                   static_cast<int>(N),
                   static_cast<int>(K),
                   g_timing_without_gelu.load() ? 0 : 1};
  const CUtensorMap out_map = tensor_map_of(grad_pre.raw_data(), M, N, N, rows, 64, op);
  launch_gemm_gelu<true>(a_map, b_map, pre_map, out_map, e, tile_n, grad_out.device(), op);
}

void set_gemm_gelu_sm90_cluster(int ctas) {
  PRECIS_CHECK(ctas == 1 || ctas == 2, "set_gemm_gelu_sm90_cluster: 1 or 2 blocks, got ", ctas);
  g_cluster = ctas;
}

void set_gemm_gelu_sm90_tma_store(bool on) { g_tma_store = on ? 1 : 0; }

bool gemm_gelu_sm90_tma_store() {
  int on = g_tma_store.load(std::memory_order_relaxed);
  if (on < 0) {
    const char* setting = std::getenv("PRECIS_EXP_GEMM_GELU_EPI");
    int unset = -1;
    g_tma_store.compare_exchange_strong(unset, setting != nullptr && std::string(setting) == "reg" ? 0 : 1);
    on = g_tma_store.load();
  }
  return on == 1;
}

void set_gemm_gelu_sm90_timing_without_gelu(bool on) { g_timing_without_gelu = on; }

void set_gemm_gelu_sm90_tile(int columns) {
  PRECIS_CHECK(columns == 128 || columns == 192 || columns == 256,
               "set_gemm_gelu_sm90_tile: 128, 192 or 256 columns, got ", columns);
  g_tile_n = columns;
}

int gemm_gelu_sm90_tile() {
  int columns = g_tile_n.load(std::memory_order_relaxed);
  if (columns == 0) {
    const char* setting = std::getenv("PRECIS_EXP_GEMM_GELU_TILE");
    int unset = 0;
    const std::string tile = setting != nullptr ? setting : "";
    g_tile_n.compare_exchange_strong(unset, tile == "128x256" ? 256 : tile == "128x192" ? 192 : 128);
    columns = g_tile_n.load();
  }
  return columns;
}

int gemm_gelu_sm90_cluster() {
  int ctas = g_cluster.load(std::memory_order_relaxed);
  if (ctas == 0) {
    const char* setting = std::getenv("PRECIS_EXP_GEMM_GELU_CLUSTER");
    int unset = 0;
    g_cluster.compare_exchange_strong(unset, setting != nullptr && std::string(setting) == "1" ? 1 : 2);
    ctas = g_cluster.load();
  }
  return ctas;
}

}  // namespace precis::ops::cuda
