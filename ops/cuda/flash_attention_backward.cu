// Flash attention, backward (FlashAttention-2), for f16/bf16 on sm_80+.
//
// With S = scale Q K^T, P = softmax(S) (rows), O = P V and the output gradient dO:
//   dV = P^T dO
//   dP = dO V^T
//   dS = P * (dP - delta),   delta_i = sum_j P_ij dP_ij = sum_d dO_id O_id
//   dQ = scale dS K          dK = scale dS^T Q
// (the softmax backward, with delta_i from O and dO instead of P: one pass over
// two [Tq, D] matrices instead of the [Tq, Tk] one.)
//
// Nothing of size Tq x Tk is stored: P is recomputed tile by tile from Q, K and the
// forward's lse (P_ij = exp(S_ij - lse_i)). Three kernels:
//   1. delta_i = rowsum(dO * O), and zeros in an f32 dQ buffer    reads 2 Tq D values
//   2. one thread block per block of keys: keeps K, V and the dK, dV sums of its keys
//      on chip and walks the query blocks (causal: from the diagonal on), recomputing
//      S, P, dP, dS there. dK, dV are written once at the end; dQ gets each key block's
//      contribution added into the f32 buffer with atomics (so the order of those
//      additions, and dQ's last bits, can vary between runs; dK and dV cannot).
//   3. dQ = that f32 buffer rounded to q's dtype.
// With FlashGradSums (flash_attention.h: the column sums of dq, dk, dv, for the bias of the
// product that made q, k, v), kernel 2 also writes the column sums of each key block's dK
// and dV (as rounded) to a partial row, kernel 3 rounds dQ by blocks of rows of one head and
// writes their column sums the same way, and
//   4. adds the partial rows of each column in order, rounded once to the sums' dtype.
// The sums read nothing the kernels did not already hold: dq, dk, dv are not read again
// (a separate column-sum pass would read all three once more).
// On Hopper at head size 64, kernel 2 is the wgmma one of flash_attention_backward_sm90.cu.
// Traffic per (b, h): K, V, dK, dV once; Q, dO, lse, delta once per key block; dQ's
// f32 buffer read-modify-written once per key block. Arithmetic: 5 products of
// 2 Tq Tk D flops each (S, dP, dV, dK, dQ), half of it skipped when causal.
#include <type_traits>

#include "core/copy.h"
#include "core/cuda/convert.cuh"
#include "core/cuda/dispatch.cuh"
#include "core/cuda/launch.cuh"
#include "ops/cuda/flash_attention.h"
#include "ops/cuda/flash_attention_sm90.h"
#include "ops/cuda/flash_mma.cuh"
#include "ops/cuda/flash_params.cuh"

namespace precis::ops::cuda {

using namespace precis::cuda;  // the device toolkit (core/cuda/)

namespace {

using namespace flash;

constexpr int kThreads = 256, kBlockM = 64;  // 8 warps; query rows per step of the walk
constexpr float kLog2e = 1.4426950408889634f;

// ---- 1. delta_i = sum_d dO_id O_id, kD / 8 threads per row (16-byte loads), f32; and
// the zeros of the f32 dQ sums (the same rows, so no separate memset pass).

template <typename T, int kD>
__global__ void flash_delta_kernel(HeadsView<const T> out, HeadsView<const T> dout, float* delta, float* dq_accum,
                                   Sizes s, int64_t rows) {
  precis::cuda::wait_for_previous_grid();
  precis::cuda::allow_next_grid_to_start();
  constexpr int kLanesPerRow = kD / 8;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t row = t / kLanesPerRow;
  const int col = static_cast<int>(t % kLanesPerRow) * 8;
  float acc = 0.f;
  if (row < rows) {
    const int bh = static_cast<int>(row / s.q_len), i = static_cast<int>(row % s.q_len);
    const int b = bh / s.heads, h = bh % s.heads;
    const uint4 o4 = *reinterpret_cast<const uint4*>(out.matrix(b, h) + i * out.row_stride + col);
    const uint4 g4 = *reinterpret_cast<const uint4*>(dout.matrix(b, h) + i * dout.row_stride + col);
    const T* o8 = reinterpret_cast<const T*>(&o4);
    const T* g8 = reinterpret_cast<const T*>(&g4);
#pragma unroll
    for (int e = 0; e < 8; ++e) acc += static_cast<float>(o8[e]) * static_cast<float>(g8[e]);
    float4* zeros = reinterpret_cast<float4*>(dq_accum + row * kD + col);
    zeros[0] = zeros[1] = make_float4(0.f, 0.f, 0.f, 0.f);
  }
#pragma unroll
  for (int offset = kLanesPerRow / 2; offset > 0; offset /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, offset);
  if (row < rows && col == 0) delta[row] = acc;
}

// ---- 2. dK, dV of one key block, and its share of dQ.
//
// Two roles of 4 warps each; warp w and warp w + 4 own the same kKeysPerWarp keys and
// sit on the same SM sub-partition:
//   probability warps      S^T = K Q^T,  P^T = exp(scale S^T - lse),  dV += P^T dO
//   score-gradient warps   dP^T = V dO^T,  dS^T = P^T (dP^T - delta),  dK += dS^T Q,
//                          dQ += scale dS K (32 query rows x kD/2 columns each)
// Keys are the rows of a warp's products, so a probability warp's K fragments stay in
// registers for the whole walk (a score-gradient warp re-reads V's each step), and the
// C fragments of P^T and dS^T are, as they are, the A fragments of the dV and dK
// products (see flash_mma.cuh). P^T reaches the score-gradient warp of the same keys
// through a shared-memory "exchange" (16-bit, in the fragment layout, so 16-byte
// accesses without conflicts); dS^T goes to shared memory as a [key][query] tile for
// dQ, whose rows are queries.
//
// The probability warps run one query block ahead: while they exponentiate block m + 1,
// the score-gradient warps run their products on block m, so the special-function unit
// and the tensor cores of a sub-partition work at once. Named barriers hand blocks over:
//   kQueryBlockLoaded    probability warps (who issue every query-block copy): block m
//                        has landed in shared memory
//   kProbabilitiesReady  P^T of block m is in exchange slot m % 2 (and block m's Q, dO,
//                        delta are visible to the score-gradient warps)
//   kScoreGradsStored    score-gradient warps: dS^T of block m is complete, for dQ
//   kScoreGradsDone      score-gradient warps are done with block m: its stage and
//                        exchange slot may be refilled
// Shared memory: K, V [kBlockN][kD]; Q, dO [kStages][kBlockM][kD] (blocks m and m + 1 in
// use, m + 2 loading) and lse, delta beside them; the exchange and dS^T in 2 slots.
// Per step of 64 queries x 128 keys (D = 64) the warps read ~225 KB of fragments from
// shared memory and write ~50 KB. A layout with 16 query rows per warp in every product
// (this kernel's predecessor) read ~460 KB and wrote ~50 KB, and spent its time waiting
// on the shared-memory pipe (75% busy on an H100).

template <int kD>
struct BackwardTile {
  // Keys per warp: the warp's K (or V) fragments, its dV (or dK) sums and its
  // [keys x 64 queries] score tile must fit in 255 registers with everything else.
  static constexpr int kKeysPerWarp = kD == 64 ? 32 : 16;
  static constexpr int kKeyTiles = kKeysPerWarp / 16;  // m16 tiles of keys per warp
  static constexpr int kBlockN = 4 * kKeysPerWarp;     // keys per thread block
  static constexpr int kStages = 3;
  // One warp's P^T in one slot: kKeyTiles x (kBlockM / 16) A fragments of 16 bytes per lane.
  static constexpr int kExchangeBytes = kKeyTiles * (kBlockM / 16) * 16 * 32;
  static constexpr int kSmemBytes = 2 * kBlockN * kD * 2 + 2 * kStages * kBlockM * kD * 2 + 2 * 4 * kExchangeBytes +
                                    2 * kBlockN * kBlockM * 2 + 2 * kStages * kBlockM * 4;
};

enum BackwardBarrier : int {  // 0 is __syncthreads'
  kQueryBlockLoaded = 1,
  kProbabilitiesReady = 2,  // + slot
  kScoreGradsDone = 4,      // + slot
  kScoreGradsStored = 6,
};

// acc[keys x kD] += frag (keys x queries, A fragments) x cols, cols = [kBlockM][kD] tile.
template <typename T, int kD, int kKeyTiles>
__device__ __forceinline__ void accumulate_keys_times_cols(float (&acc)[kKeyTiles][kD / 8][4],
                                                           const uint32_t (&frag)[kKeyTiles][kBlockM / 16][4],
                                                           const T* cols, int lane) {
#pragma unroll
  for (int j = 0; j < kBlockM / 16; ++j)
#pragma unroll
    for (int dp = 0; dp < kD / 16; ++dp) {
      uint32_t bf[4];
      load_b_from_cols<kD>(bf, cols, j * 16, dp * 16, lane);
#pragma unroll
      for (int mt = 0; mt < kKeyTiles; ++mt) {
        mma_16816<T>(acc[mt][2 * dp], frag[mt][j], bf[0], bf[1]);
        mma_16816<T>(acc[mt][2 * dp + 1], frag[mt][j], bf[2], bf[3]);
      }
    }
}

// kSums: also the column sums of the dK and dV the block writes, of the values as rounded,
// into its row of kv_partial ([B key blocks][dK, dV][H kD] f32): a thread's keys, then the 8
// lanes of its columns (sum_over_fragment_rows), then the 4 warps of a role in order.
template <typename T, int kD, bool kSums>
__global__ void __launch_bounds__(kThreads, 1)
    flash_backward_kernel(HeadsView<const T> q, HeadsView<const T> k, HeadsView<const T> v, HeadsView<const T> dout,
                          const float* lse, const float* delta, float* dq_accum, HeadsView<T> dk, HeadsView<T> dv,
                          Sizes s, float* kv_partial) {
  precis::cuda::wait_for_previous_grid();
  using Tile = BackwardTile<kD>;
  constexpr int kBlockN = Tile::kBlockN, kKeyTiles = Tile::kKeyTiles, kQueryTiles = kBlockM / 8;
  constexpr int kStages = Tile::kStages, kRoleThreads = kThreads / 2;
  constexpr int kExchangeWords = Tile::kExchangeBytes / 16;  // uint4 per warp and slot
  extern __shared__ __align__(16) unsigned char smem[];
  T* sK = reinterpret_cast<T*>(smem);
  T* sV = sK + kBlockN * kD;
  T* sQ = sV + kBlockN * kD;                                                  // [kStages][kBlockM * kD]
  T* sdO = sQ + kStages * kBlockM * kD;                                       // [kStages][kBlockM * kD]
  uint4* sExchange = reinterpret_cast<uint4*>(sdO + kStages * kBlockM * kD);  // [2 slots][4 warps][words]
  T* sdSt = reinterpret_cast<T*>(sExchange + 2 * 4 * kExchangeWords);         // [2 slots][kBlockN][kBlockM]
  float* sLse = reinterpret_cast<float*>(sdSt + 2 * kBlockN * kBlockM);       // [kStages][kBlockM]
  float* sDelta = sLse + kStages * kBlockM;                                   // [kStages][kBlockM]

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int bh = blockIdx.x, b = bh / s.heads, h = bh % s.heads;
  const int n0 = blockIdx.y * kBlockN;
  const QueryRows<T, kD> qrows = query_rows<kD>(q, dout, lse, delta, dq_accum, s, b, h, bh);

  // The probability warps (tid < kRoleThreads) start copying query block m into `stage`:
  // Q, dO, lse, delta. Rows past the end read as zeros: their dO is zero, so whatever
  // their P, they add nothing to any gradient.
  auto load_query_block = [&](int m, int stage) {
    const int m0 = m * kBlockM;
    load_tile_async<kBlockM, kD, kRoleThreads>(sQ + stage * kBlockM * kD, qrows.q + m0 * q.row_stride, q.row_stride,
                                               s.q_len - m0, tid);
    load_tile_async<kBlockM, kD, kRoleThreads>(sdO + stage * kBlockM * kD, qrows.dout + m0 * dout.row_stride,
                                               dout.row_stride, s.q_len - m0, tid);
    const int row = tid % kBlockM;
    const bool valid = m0 + row < s.q_len;
    if (tid < kBlockM)
      cp_async_4(sLse + stage * kBlockM + row, valid ? qrows.lse + m0 + row : qrows.lse, valid);
    else
      cp_async_4(sDelta + stage * kBlockM + row, valid ? qrows.delta + m0 + row : qrows.delta, valid);
  };

  // Causal: queries before n0 see none of these keys.
  const int m_begin = s.causal ? n0 / kBlockM : 0, m_end = ceil_div(s.q_len, kBlockM);
  const bool probability_warp = warp < 4;
  load_tile_async<kBlockN, kD, kThreads>(sK, k.matrix(b, h) + n0 * k.row_stride, k.row_stride, s.k_len - n0, tid);
  load_tile_async<kBlockN, kD, kThreads>(sV, v.matrix(b, h) + n0 * v.row_stride, v.row_stride, s.k_len - n0, tid);
  if (probability_warp && m_begin < m_end) load_query_block(m_begin, m_begin % kStages);
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();

  const int key0 = (warp % 4) * Tile::kKeysPerWarp;  // the warp's first key in the block
  // dV (probability warps) or the unscaled dK (score-gradient warps) of the warp's keys.
  float acc[kKeyTiles][kD / 8][4];
#pragma unroll
  for (int mt = 0; mt < kKeyTiles; ++mt)
#pragma unroll
    for (int dt = 0; dt < kD / 8; ++dt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mt][dt][e] = 0.f;
  const int col = 2 * (lane % 4);  // the thread's first query column in each 8-column tile
  float st[kKeyTiles][kQueryTiles][4];
  uint32_t frag[kKeyTiles][kBlockM / 16][4];  // P^T or dS^T, rounded, as A fragments

  if (probability_warp) {
    // K of the warp's keys, as A fragments, for the whole walk.
    uint32_t kf[kKeyTiles][kD / 16][4];
#pragma unroll
    for (int mt = 0; mt < kKeyTiles; ++mt)
#pragma unroll
      for (int ks = 0; ks < kD / 16; ++ks) load_a<kD>(kf[mt][ks], sK, key0 + mt * 16, ks * 16, lane);
    for (int m = m_begin; m < m_end; ++m) {
      const int m0 = m * kBlockM, stage = m % kStages, slot = m & 1;
      // Block m - 2's stage (where block m + 1 goes) and exchange slot (block m's) are free
      // once the score-gradient warps are done with block m - 2.
      if (m - 2 >= m_begin) barrier_sync(kScoreGradsDone + slot, kThreads);
      if (m + 1 < m_end) {
        load_query_block(m + 1, (m + 1) % kStages);
        cp_async_commit();
        cp_async_wait<1>();
      } else {
        cp_async_wait<0>();
      }
      barrier_sync(kQueryBlockLoaded, kRoleThreads);

      // P^T = exp2(S^T scale log2(e) - lse log2(e)); masked keys get exponent -inf.
      fragments_times_rows<T, kD>(st, kf, sQ + stage * kBlockM * kD, lane);  // S^T = K Q^T
#pragma unroll
      for (int nt = 0; nt < kQueryTiles; ++nt) {
        const float2 row_lse = *reinterpret_cast<const float2*>(sLse + stage * kBlockM + nt * 8 + col);
        const float lse_log2[2] = {row_lse.x * kLog2e, row_lse.y * kLog2e};
#pragma unroll
        for (int mt = 0; mt < kKeyTiles; ++mt)
#pragma unroll
          for (int e = 0; e < 4; ++e) st[mt][nt][e] = st[mt][nt][e] * s.scale_log2 - lse_log2[e & 1];
      }
      if (n0 + kBlockN > s.k_len || (s.causal && n0 + kBlockN - 1 > m0)) {
#pragma unroll
        for (int mt = 0; mt < kKeyTiles; ++mt)
#pragma unroll
          for (int nt = 0; nt < kQueryTiles; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int key = n0 + key0 + mt * 16 + lane / 4 + 8 * (e >> 1), query = m0 + nt * 8 + col + (e & 1);
              if ((key >= s.k_len) | (s.causal & (key > query))) st[mt][nt][e] = -INFINITY;
            }
      }
      uint4* exchange = sExchange + (slot * 4 + warp) * kExchangeWords;
#pragma unroll
      for (int mt = 0; mt < kKeyTiles; ++mt)
#pragma unroll
        for (int j = 0; j < kBlockM / 16; ++j) {
          // The C fragments of query tiles 2j, 2j + 1 are the A fragment of query step j.
          frag[mt][j][0] = pack2<T>(exp2_fast(st[mt][2 * j][0]), exp2_fast(st[mt][2 * j][1]));
          frag[mt][j][1] = pack2<T>(exp2_fast(st[mt][2 * j][2]), exp2_fast(st[mt][2 * j][3]));
          frag[mt][j][2] = pack2<T>(exp2_fast(st[mt][2 * j + 1][0]), exp2_fast(st[mt][2 * j + 1][1]));
          frag[mt][j][3] = pack2<T>(exp2_fast(st[mt][2 * j + 1][2]), exp2_fast(st[mt][2 * j + 1][3]));
          exchange[(mt * (kBlockM / 16) + j) * 32 + lane] =
              make_uint4(frag[mt][j][0], frag[mt][j][1], frag[mt][j][2], frag[mt][j][3]);
        }
      barrier_arrive(kProbabilitiesReady + slot, kThreads);

      accumulate_keys_times_cols<T, kD>(acc, frag, sdO + stage * kBlockM * kD, lane);  // dV += P^T dO
    }
    // Take the score-gradient warps' last two "done" signals, so none is left pending.
    for (int m = max(m_end - 2, m_begin); m < m_end; ++m) barrier_sync(kScoreGradsDone + (m & 1), kThreads);
  } else {
    const int dq_row0 = (warp % 2) * 32, dq_col0 = (warp % 4 / 2) * (kD / 2);  // the warp's share of dQ
    for (int m = m_begin; m < m_end; ++m) {
      const int m0 = m * kBlockM, stage = m % kStages, slot = m & 1;
      barrier_sync(kProbabilitiesReady + slot, kThreads);
      const T* sQb = sQ + stage * kBlockM * kD;
      T* sdStb = sdSt + slot * kBlockN * kBlockM;

      // dS^T = P^T (dP^T - delta): into frag for dK, and into shared memory for dQ.
      {
        // V of the warp's keys, re-read each step: kept in registers as well, it would
        // push this role past 255 registers (spills cost more than these 8 ldmatrix).
        uint32_t vf[kKeyTiles][kD / 16][4];
#pragma unroll
        for (int mt = 0; mt < kKeyTiles; ++mt)
#pragma unroll
          for (int ks = 0; ks < kD / 16; ++ks) load_a<kD>(vf[mt][ks], sV, key0 + mt * 16, ks * 16, lane);
        fragments_times_rows<T, kD>(st, vf, sdO + stage * kBlockM * kD, lane);  // dP^T = V dO^T
      }
      float2 row_delta[kQueryTiles];
#pragma unroll
      for (int nt = 0; nt < kQueryTiles; ++nt)
        row_delta[nt] = *reinterpret_cast<const float2*>(sDelta + stage * kBlockM + nt * 8 + col);
      const uint4* exchange = sExchange + (slot * 4 + warp % 4) * kExchangeWords;
#pragma unroll
      for (int mt = 0; mt < kKeyTiles; ++mt)
#pragma unroll
        for (int j = 0; j < kBlockM / 16; ++j) {
          const uint4 p4 = exchange[(mt * (kBlockM / 16) + j) * 32 + lane];
          const uint32_t p[4] = {p4.x, p4.y, p4.z, p4.w};
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const int nt = 2 * j + i / 2, half = i % 2;  // p[i] holds P^T at st[mt][nt][2 half .. 2 half + 1]
            const float2 pr = unpack2<T>(p[i]);
            frag[mt][j][i] = pack2<T>(pr.x * (st[mt][nt][2 * half] - row_delta[nt].x),
                                      pr.y * (st[mt][nt][2 * half + 1] - row_delta[nt].y));
            *reinterpret_cast<uint32_t*>(
                sdStb + swizzled<kBlockM>(key0 + mt * 16 + lane / 4 + 8 * half, nt * 8 + col)) = frag[mt][j][i];
          }
        }
      barrier_sync(kScoreGradsStored, kRoleThreads);

      accumulate_keys_times_cols<T, kD>(acc, frag, sQb, lane);  // dK += dS^T Q

      // dQ[rows] += scale dS K over the block's keys: 32 query rows x kD/2 columns.
      float dq[2][kD / 16][4];
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int nt = 0; nt < kD / 16; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) dq[mt][nt][e] = 0.f;
#pragma unroll
      for (int ks = 0; ks < kBlockN / 16; ++ks) {
        uint32_t a[2][4];
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) load_a_transposed<kBlockM>(a[mt], sdStb, ks * 16, dq_row0 + mt * 16, lane);
#pragma unroll
        for (int cp = 0; cp < kD / 32; ++cp) {
          uint32_t bf[4];
          load_b_from_cols<kD>(bf, sK, ks * 16, dq_col0 + cp * 16, lane);
#pragma unroll
          for (int mt = 0; mt < 2; ++mt) {
            mma_16816<T>(dq[mt][2 * cp], a[mt], bf[0], bf[1]);
            mma_16816<T>(dq[mt][2 * cp + 1], a[mt], bf[2], bf[3]);
          }
        }
      }
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int row = m0 + dq_row0 + mt * 16 + lane / 4 + 8 * half;
          if (row >= s.q_len) continue;
          float* dst = qrows.dq_accum + static_cast<int64_t>(row) * kD + dq_col0 + col;
#pragma unroll
          for (int nt = 0; nt < kD / 16; ++nt)
            atomic_add_pair(dst + nt * 8, dq[mt][nt][2 * half] * s.scale, dq[mt][nt][2 * half + 1] * s.scale);
        }
      barrier_arrive(kScoreGradsDone + slot, kThreads);
    }
  }

  // dV (probability warps) or dK, scaled (score-gradient warps), of the warp's keys.
  const HeadsView<T> grad = probability_warp ? dv : dk;
  const float factor = probability_warp ? 1.f : s.scale;
#pragma unroll
  for (int mt = 0; mt < kKeyTiles; ++mt)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int key = n0 + key0 + mt * 16 + lane / 4 + 8 * half;
      if (key >= s.k_len) continue;
      T* grad_row = grad.matrix(b, h) + key * grad.row_stride;
#pragma unroll
      for (int dt = 0; dt < kD / 8; ++dt)
        *reinterpret_cast<uint32_t*>(grad_row + dt * 8 + col) =
            pack2<T>(acc[mt][dt][2 * half] * factor, acc[mt][dt][2 * half + 1] * factor);
    }
  if constexpr (kSums) {
    // Shared memory is free once every warp is past its walk: each thread's sums of its keys
    // (lane / 4 of each 8) go to row lane / 4 of its warp, then the 32 rows of a role are
    // added in order.
    float* sSums = reinterpret_cast<float*>(smem);  // [8 warps][8 rows][kD]: dV warps 0-3, dK warps 4-7
    __syncthreads();
#pragma unroll
    for (int dt = 0; dt < kD / 8; ++dt) {
      float2 sum = make_float2(0.f, 0.f);
#pragma unroll
      for (int mt = 0; mt < kKeyTiles; ++mt)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const bool valid = n0 + key0 + mt * 16 + lane / 4 + 8 * half < s.k_len;
          const float2 written =
              unpack2<T>(pack2<T>(acc[mt][dt][2 * half] * factor, acc[mt][dt][2 * half + 1] * factor));
          sum.x += valid ? written.x : 0.f, sum.y += valid ? written.y : 0.f;
        }
      *reinterpret_cast<float2*>(sSums + (warp * 8 + lane / 4) * kD + dt * 8 + col) = sum;
    }
    __syncthreads();
    if (tid < 2 * kD) {
      const int part = tid / kD, c = tid % kD;  // part 0: dK (warps 4-7), 1: dV (warps 0-3)
      float total = 0.f;
#pragma unroll 8
      for (int r = 0; r < 32; ++r) total += sSums[((1 - part) * 32 + r) * kD + c];
      const int64_t row = static_cast<int64_t>(b) * gridDim.y + blockIdx.y;
      kv_partial[(row * 2 + part) * s.heads * kD + h * kD + c] = total;
    }
  }
}

// ---- 3. dQ = the f32 sums rounded to q's dtype, 8 values per thread.

template <typename T, int kD>
__global__ void flash_dq_kernel(const float* dq_accum, HeadsView<T> dq, Sizes s, int64_t chunks) {
  precis::cuda::wait_for_previous_grid();
  precis::cuda::allow_next_grid_to_start();
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= chunks) return;
  const int64_t row = t / (kD / 8);
  const int col = static_cast<int>(t % (kD / 8)) * 8;
  const int bh = static_cast<int>(row / s.q_len), i = static_cast<int>(row % s.q_len);
  const float4 lo = *reinterpret_cast<const float4*>(dq_accum + row * kD + col);
  const float4 hi = *reinterpret_cast<const float4*>(dq_accum + row * kD + col + 4);
  uint4 packed{pack2<T>(lo.x, lo.y), pack2<T>(lo.z, lo.w), pack2<T>(hi.x, hi.y), pack2<T>(hi.z, hi.w)};
  *reinterpret_cast<uint4*>(dq.matrix(bh / s.heads, bh % s.heads) + i * dq.row_stride + col) = packed;
}

// ---- 3 with column sums: the same rounding, by blocks of kDqSumRows rows of one head (block
// bh q_chunks + chunk), and the column sums of the dQ values written, rounded, for FlashGradSums:
//   q_partial[b q_chunks + chunk, h kD + d] = sum over the chunk's rows i of dQ[b, h, i, d].
// kLanes = kD / 8 threads per row (8 values each, 16-byte loads), kRows = 256 / kLanes rows
// at a time; thread (row r, lane) adds rows r, r + kRows, ... of the chunk in order into 8 f32
// sums, and thread d < kD then adds the kRows sums of column d in order.
constexpr int kDqSumRows = 128;  // rows per block: 4 a thread at kD = 64, 8 at 128

template <typename T, int kD>
__global__ void __launch_bounds__(256)
    flash_dq_sums_kernel(const float* dq_accum, HeadsView<T> dq, Sizes s, float* q_partial) {
  precis::cuda::wait_for_previous_grid();
  precis::cuda::allow_next_grid_to_start();
  constexpr int kLanes = kD / 8, kRows = 256 / kLanes;
  __shared__ float sums[kRows][kD];
  const int q_chunks = ceil_div(s.q_len, kDqSumRows);
  const int chunk = blockIdx.x % q_chunks, bh = blockIdx.x / q_chunks, b = bh / s.heads, h = bh % s.heads;
  const int r = threadIdx.x / kLanes, col = (threadIdx.x % kLanes) * 8;
  const int first = chunk * kDqSumRows, last = min(first + kDqSumRows, s.q_len);
  float acc[8];
#pragma unroll
  for (int e = 0; e < 8; ++e) acc[e] = 0.f;
  T* dq_head = dq.matrix(b, h);
#pragma unroll 4
  for (int i = first + r; i < last; i += kRows) {
    const float* src = dq_accum + (static_cast<int64_t>(bh) * s.q_len + i) * kD + col;
    const float4 lo = *reinterpret_cast<const float4*>(src);
    const float4 hi = *reinterpret_cast<const float4*>(src + 4);
    const uint4 packed{pack2<T>(lo.x, lo.y), pack2<T>(lo.z, lo.w), pack2<T>(hi.x, hi.y), pack2<T>(hi.z, hi.w)};
    *reinterpret_cast<uint4*>(dq_head + static_cast<int64_t>(i) * dq.row_stride + col) = packed;
    const float2 r0 = unpack2<T>(packed.x), r1 = unpack2<T>(packed.y), r2 = unpack2<T>(packed.z),
                 r3 = unpack2<T>(packed.w);
    acc[0] += r0.x, acc[1] += r0.y, acc[2] += r1.x, acc[3] += r1.y;
    acc[4] += r2.x, acc[5] += r2.y, acc[6] += r3.x, acc[7] += r3.y;
  }
#pragma unroll
  for (int e = 0; e < 8; ++e) sums[r][col + e] = acc[e];
  __syncthreads();
  if (threadIdx.x < kD) {
    float sum = 0.f;
#pragma unroll 8
    for (int k = 0; k < kRows; ++k) sum += sums[k][threadIdx.x];
    q_partial[(static_cast<int64_t>(b) * q_chunks + chunk) * s.heads * kD + h * kD + threadIdx.x] = sum;
  }
}

// ---- 4. FlashGradSums: out[c] for c < 3 H kD (dQ, dK, dV columns, h kD + d within each) =
// the sum of column c of the partial rows in order: q_partial [q_rows][H kD] for dQ,
// kv_partial [kv_rows][dK, dV][H kD] for dK and dV; rounded once to O, added to out's value
// first (in f32) with `accumulate`. A block of (32, kFinishSlices) threads covers 32 columns:
// thread (x, y) adds partial rows y, y + kFinishSlices, ... in order (their loads in flight
// together), then thread (x, 0) adds the kFinishSlices sums in order: column_sums' second
// stage (ops/cuda/column_sums.cu), over the two partial matrices in one launch.
constexpr int kFinishSlices = 16;

template <typename O>
__global__ void __launch_bounds__(32 * kFinishSlices)
    flash_grad_sums_finish_kernel(const float* q_partial, int64_t q_rows, const float* kv_partial, int64_t kv_rows,
                                  int64_t hd, O* out, bool accumulate) {
  precis::cuda::wait_for_previous_grid();
  precis::cuda::allow_next_grid_to_start();
  __shared__ float slices[kFinishSlices][33];
  const int64_t c = static_cast<int64_t>(blockIdx.x) * 32 + threadIdx.x;
  float sum = 0.f;
  if (c < 3 * hd) {
    const bool q_col = c < hd;
    const float* p = q_col ? q_partial + c : kv_partial + (c - hd);
    const int64_t rows = q_col ? q_rows : kv_rows, stride = q_col ? hd : 2 * hd;
#pragma unroll 8
    for (int64_t k = threadIdx.y; k < rows; k += kFinishSlices) sum += p[k * stride];
  }
  slices[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y == 0 && c < 3 * hd) {
#pragma unroll
    for (int y = 1; y < kFinishSlices; ++y) sum += slices[y][threadIdx.x];
    out[c] = convert_to<O>(accumulate ? convert_to<float>(out[c]) + sum : sum);
  }
}

template <typename T, int kD>
void launch_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                     const Tensor& dout, const Sizes& s, const Tensor& dq, const Tensor& dk, const Tensor& dv,
                     const FlashGradSums& grad_sums, bool sm90, cudaStream_t stream) {
  const char* op = "flash_attention backward";
  const int64_t rows = static_cast<int64_t>(s.batch) * s.heads * s.q_len;
  Tensor delta = empty({rows}, DType::f32, q.device());
  Tensor dq_accum = empty({rows, kD}, DType::f32, q.device());

  constexpr int kElementwiseThreads = 256;
  const int64_t chunks = rows * (kD / 8);
  const unsigned chunk_blocks = static_cast<unsigned>((chunks + kElementwiseThreads - 1) / kElementwiseThreads);
  precis::cuda::launch(flash_delta_kernel<T, kD>, chunk_blocks, kElementwiseThreads, 0, stream,
                       heads_view<const T>(out), heads_view<const T>(dout), static_cast<float*>(delta.raw_data()),
                       static_cast<float*>(dq_accum.raw_data()), s, rows);
  PRECIS_CUDA_CHECK_LAUNCH(op);

  // FlashGradSums: the partial rows of the key-block kernel (one per batch and key block) and
  // of the dQ rounding (one per batch and chunk of kDqSumRows queries).
  const bool sums = grad_sums.sums.defined();
  const int key_block_keys = sm90 ? kSm90BackwardBlockKeys : BackwardTile<kD>::kBlockN;
  const int64_t kv_rows = static_cast<int64_t>(s.batch) * ceil_div(s.k_len, key_block_keys);
  const int q_chunks = ceil_div(s.q_len, kDqSumRows);
  const int64_t hd = static_cast<int64_t>(s.heads) * kD, q_rows = static_cast<int64_t>(s.batch) * q_chunks;
  const Tensor kv_partial = sums ? empty({kv_rows, 2 * hd}, DType::f32, q.device()) : Tensor();
  const Tensor q_partial = sums ? empty({q_rows, hd}, DType::f32, q.device()) : Tensor();

  if (sm90) {
    flash_backward_key_blocks_sm90(q, k, v, dout, lse, delta, dq_accum, s.causal, s.scale, dk, dv, kv_partial);
  } else {
    using Tile = BackwardTile<kD>;
    const dim3 grid(s.batch * s.heads, ceil_div(s.k_len, Tile::kBlockN));
    auto launch = [&](auto kernel) {
      launch_with_shared_memory(kernel, grid, kThreads, Tile::kSmemBytes, stream, op, heads_view<const T>(q),
                                heads_view<const T>(k), heads_view<const T>(v), heads_view<const T>(dout),
                                static_cast<const float*>(lse.raw_data()), static_cast<const float*>(delta.raw_data()),
                                static_cast<float*>(dq_accum.raw_data()), heads_view<T>(dk), heads_view<T>(dv), s,
                                sums ? static_cast<float*>(kv_partial.raw_data()) : nullptr);
    };
    if (sums)
      launch(flash_backward_kernel<T, kD, true>);
    else
      launch(flash_backward_kernel<T, kD, false>);
    PRECIS_CUDA_CHECK_LAUNCH(op);
  }

  if (!sums) {
    precis::cuda::launch(flash_dq_kernel<T, kD>, chunk_blocks, kElementwiseThreads, 0, stream,
                         static_cast<const float*>(dq_accum.raw_data()), heads_view<T>(dq), s, chunks);
    PRECIS_CUDA_CHECK_LAUNCH(op);
    return;
  }
  const int64_t dq_blocks = static_cast<int64_t>(s.batch) * s.heads * q_chunks;  // (head, chunk), chunks fastest
  PRECIS_CHECK(dq_blocks <= INT32_MAX, op, ": ", dq_blocks, " blocks of dQ rows are more than one launch takes");
  precis::cuda::launch(flash_dq_sums_kernel<T, kD>, static_cast<unsigned>(dq_blocks), 256, 0, stream,
                       static_cast<const float*>(dq_accum.raw_data()), heads_view<T>(dq), s,
                       static_cast<float*>(q_partial.raw_data()));
  PRECIS_CUDA_CHECK_LAUNCH(op);
  auto finish = [&](auto* out) {
    using O = std::remove_pointer_t<decltype(out)>;
    precis::cuda::launch(flash_grad_sums_finish_kernel<O>, static_cast<unsigned>((3 * hd + 31) / 32),
                         dim3(32, kFinishSlices), 0, stream, static_cast<const float*>(q_partial.raw_data()), q_rows,
                         static_cast<const float*>(kv_partial.raw_data()), kv_rows, hd, out, grad_sums.accumulate);
    PRECIS_CUDA_CHECK_LAUNCH(op);
  };
  if (grad_sums.sums.dtype() == DType::f32)
    finish(static_cast<float*>(grad_sums.sums.raw_data()));
  else
    finish(static_cast<T*>(grad_sums.sums.raw_data()));
}

// The three kernels; sm90: the key blocks on the sm_90a kernel.
void run_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                  const Tensor& dout, bool causal, double scale, const Tensor& dq, const Tensor& dk, const Tensor& dv,
                  const FlashGradSums& grad_sums, bool sm90) {
  const char* op = "flash_attention backward";
  if (grad_sums.sums.defined()) {
    const Tensor& sums = grad_sums.sums;
    const int64_t columns = 3 * q.size(1) * q.size(3);
    PRECIS_CHECK(sums.device() == q.device() && (sums.dtype() == DType::f32 || sums.dtype() == q.dtype()) &&
                     sums.shape() == Shape({columns}) && sums.is_contiguous(),
                 op, ": the gradient column sums ", describe(sums), " must be contiguous [", columns,
                 "] on q's device, f32 or q's dtype");
  }
  const Sizes s = sizes_of(q, k, causal, scale);
  if (s.batch == 0 || s.heads == 0 || s.k_len == 0) {
    if (grad_sums.sums.defined() && !grad_sums.accumulate) fill_(grad_sums.sums, 0.0);
    return;
  }
  cudaStream_t stream = stream_for(q);
  dispatch_heads(q, op, [&](auto tag, auto head_size) {
    launch_backward<typename decltype(tag)::type, decltype(head_size)::value>(q, k, v, out, lse, dout, s, dq, dk, dv,
                                                                              grad_sums, sm90, stream);
  });
}

}  // namespace

void flash_attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                              const Tensor& dout, bool causal, double scale, const Tensor& dq, const Tensor& dk,
                              const Tensor& dv, const FlashGradSums& grad_sums) {
  const bool sm90 = flash_attention_backward_sm90_supported(q);  // wgmma on Hopper at head size 64
  run_backward(q, k, v, out, lse, dout, causal, scale, dq, dk, dv, grad_sums, sm90);
}

void flash_attention_backward_sm90(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                   const Tensor& lse, const Tensor& dout, bool causal, double scale, const Tensor& dq,
                                   const Tensor& dk, const Tensor& dv, const FlashGradSums& grad_sums) {
  PRECIS_CHECK(flash_attention_backward_sm90_supported(q), "flash_attention backward (sm_90a)",
               ": needs a compute-capability 9.0 GPU, f16 or bf16, head size 64");
  run_backward(q, k, v, out, lse, dout, causal, scale, dq, dk, dv, grad_sums, true);
}

}  // namespace precis::ops::cuda
