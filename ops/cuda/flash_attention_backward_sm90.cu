// Flash attention, backward, on Hopper: the key-block kernel of flash_attention_backward.cu
// (its math, its delta and dQ-rounding kernels around it, the same results up to rounding),
// with the products on warpgroup tensor-core instructions (wgmma, sm_90a;
// ops/cuda/flash_wgmma.cuh), for f16/bf16 with head size 64.
//
// With S = scale Q K^T, P = exp(S - lse), delta_i = sum_d dO_id O_id:
//   dV = P^T dO    dP = dO V^T    dS = P * (dP - delta)    dQ = scale dS K    dK = scale dS^T Q
//
// One block of 2 warpgroups per 128 keys; warpgroup w owns keys 64w..64w+63 (the rows of its
// products, so K, V and its dK, dV sums stay put) and walks the query blocks of 64 (causal:
// from the one holding the block's first key). Each step, query block m, software-pipelined
// so that the next block's scores run behind this block's dQ; each warpgroup:
//   wait for all its products (S^T of m, issued last step, is the newest)
//   issue  dP^T = V dO^T                         (A = V tile, B = dO tile, both K-major)
//   P^T = exp2(S^T scale log2 e - lse log2 e), masked where needed (overlaps dP^T)
//   issue  dV += P^T dO                          (A = P^T in registers, B = dO tile MN-major)
//   wait for dP^T; dS^T = P^T (dP^T - delta)     (overlaps dV)
//   store dS^T into its half of a shared [128 keys][64 queries] tile (one of two)
//   issue  dK += dS^T Q                          (A = dS^T in registers, B = Q tile MN-major)
//   barrier: the one of the step (below)
//   issue  dQ[:, 32w..32w+31] = dS K             (A = the dS^T tile read transposed, B = K
//                                                 tile MN-major, columns 32w..32w+31)
//   issue  S^T = K Q^T of block m + 1            (A = K tile, B = Q tile, both K-major)
//   wait for dQ (S^T of m + 1 keeps running); write scale dQ into a shared f32 dQ tile
//   [64 queries][64] (one of two), which thread 0 adds into the f32 dQ sums after the next
//   barrier with one bulk asynchronous reduction (cp.reduce.async.bulk .add.f32, the TMA
//   unit: the tile's rows are contiguous in the sums) while the block goes on
// lse and delta index the accumulators' columns (queries). ptxas serializes every wgmma of
// the kernel (its notes C7514, C7515 in the build log) unless the groups in flight are plain
// to it: the first wait after the loop's head, with S^T in flight across the back edge, waits
// for all (a wait for S^T alone, with dP^T of the next block issued beside it, was not
// plain), and no wgmma is issued under a condition (so the last step, which starts no
// scores, is a separate copy of the step).
// The barrier of step m: both warpgroups' halves of dS^T are in its tile; block m + 1
// (Q, dO, lse, delta: three stages, loaded with cp.async by all threads two blocks ahead)
// has landed; both warpgroups are past block m - 1's products, so its stage may be refilled
// with block m + 2; the dQ tile of block m - 1 is written (thread 0 starts its reduction)
// and thread 0's reduction of block m - 2 has read the other tile. Two dS^T tiles, since a
// warpgroup may store block m + 1's while the other still reads block m's in its dQ.
// Shared memory 150,016 bytes: K, V, 2 dS^T tiles 16 KB each; 3 stages of Q, dO 8 KB each;
// 2 dQ tiles 16 KB each; lse, delta; 1 KB of alignment.
// The blocks start heads in groups (flash_backward_key_blocks_sm90): the key blocks of a
// few heads together, so that their Q, dO and dQ sums stay in L2.
//
// Registers: 237 a thread (234 with the column sums), no spills (one block per SM). The pipeline and the bulk dQ
// reductions pay at long sequences; the head groups pay at short ones, where with heads
// fastest in the grid 192 heads' Q, dO and dQ sums (100 MB at T = 1024) do not stay in L2
// while each head's key blocks walk them at different times. bench/NOTES.md and
// docs/flash-attention.md have the measured times against the previous version.
//
// Memory traffic per (b, h): K, V, dK, dV once; Q, dO, lse, delta once per key block; the
// f32 dQ sums read-modify-written once per key block (bulk reductions in L2). Arithmetic:
// 5 products of 2 Tq Tk D flops each (half skipped when causal), Tq Tk exponentials.
//
// Column sums (FlashGradSums, ops/cuda/flash_attention.h; kv_partial given): after writing
// dK and dV, each block adds up, per column, the values it wrote (rounded to T, in f32): a
// thread's two keys, then the 8 lanes holding the same columns (shuffles), then the 8 warps
// in order through shared memory (the dS^T tiles, free after the walk), and thread c < 2 kD
// writes column c of its dK, dV partial row. Only after the walk, from dK, dV's registers:
// the walk itself is the kernel without sums.
//
// The code assembles only in the sm_90a pass (CMakeLists.txt); the sm_80 and sm_90 passes
// compile an empty kernel, and flash_attention_backward_sm90_supported checks that the
// driver loaded the sm_90a code.
#include <algorithm>
#include <type_traits>

#include "core/cuda/dispatch.cuh"
#include "core/cuda/launch.cuh"
#include "ops/cuda/flash_attention_sm90.h"
#include "ops/cuda/flash_params.cuh"
#include "ops/cuda/flash_wgmma.cuh"

namespace precis::ops::cuda {

using namespace precis::cuda;  // the device toolkit (core/cuda/)

namespace {

using namespace flash;

constexpr int kD = 64, kWarpgroups = 2, kThreads = 128 * kWarpgroups;
constexpr int kBlockN = 64 * kWarpgroups, kBlockM = 64;  // keys per block; queries per step
static_assert(kBlockN == kSm90BackwardBlockKeys);
constexpr int kStages = 3;  // query blocks in shared memory
constexpr float kLog2e = 1.4426950408889634f;
// K, V and two dS^T tiles [kBlockN][kD]; kStages stages of Q, dO [kBlockM][kD]; two f32 dQ
// tiles [kBlockM][kD]; kStages stages of lse, delta [kBlockM]; room to start the tiles on a
// 1024-byte boundary.
constexpr int kTileBytes = kBlockN * kD * 2, kStageBytes = kBlockM * kD * 2, kDqTileBytes = kBlockM * kD * 4;
constexpr int kSmemBytes =
    4 * kTileBytes + 2 * kStages * kStageBytes + 2 * kDqTileBytes + 2 * kStages * kBlockM * 4 + kSwizzleAtomBytes;

// The sum of v over the 8 lanes of a warp that hold the same columns of an accumulator
// (lanes l, l + 4, ..., l + 28: its rows lane / 4), by a fixed tree; every lane gets it.
__device__ __forceinline__ float sum_over_fragment_rows(float v) {
#pragma unroll
  for (int offset = 4; offset < 32; offset *= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// kSums: also the column sums of the dK and dV the block writes (the top comment's last
// paragraph), into kv_partial.
template <typename T, bool kSums>
__global__ void __launch_bounds__(kThreads, 1)
    flash_backward_sm90_kernel(HeadsView<const T> q, HeadsView<const T> k, HeadsView<const T> v,
                               HeadsView<const T> dout, const float* lse, const float* delta, float* dq_accum,
                               HeadsView<T> dk, HeadsView<T> dv, Sizes s, int head_group, float* kv_partial) {
  precis::cuda::wait_for_previous_grid();
  if constexpr (kSm90aPass) {
    extern __shared__ unsigned char smem_raw[];
    // Offsetting smem_raw (not rounding an integer) keeps the pointers' shared address space
    // known to the compiler: LDS/STS rather than generic loads and stores.
    T* sK = reinterpret_cast<T*>(smem_raw +
                                 (kSwizzleAtomBytes - smem_address(smem_raw) % kSwizzleAtomBytes) % kSwizzleAtomBytes);
    T* sV = sK + kBlockN * kD;
    T* sdSt = sV + kBlockN * kD;                                          // [2][kBlockN keys][kBlockM queries]
    T* sQ = sdSt + 2 * kBlockN * kBlockM;                                 // [kStages][kBlockM * kD]
    T* sdO = sQ + kStages * kBlockM * kD;                                 // [kStages][kBlockM * kD]
    float* sdQ = reinterpret_cast<float*>(sdO + kStages * kBlockM * kD);  // [2][kBlockM][kD]
    float* sLse = sdQ + 2 * kBlockM * kD;                                 // [kStages][kBlockM]
    float* sDelta = sLse + kStages * kBlockM;                             // [kStages][kBlockM]

    const int tid = threadIdx.x, warpgroup = tid / 128, lane = tid % 32;
    const int key_row0 = 64 * warpgroup;                                // the warpgroup's first key in the block
    const int thread_key0 = key_row0 + 16 * (tid / 32 % 4) + lane / 4;  // this thread's keys: +0 and +8
    const int query_row0 = 16 * (tid / 32 % 4) + lane / 4;              // its queries in dQ: +0 and +8
    const int col = 2 * (lane % 4);                                     // its first column in each 8
    // The block's head (b, h) and keys: heads in groups of head_group, the first group
    // smaller where head_group does not divide them; in a group, key blocks slowest.
    const int key_blocks = ceil_div(s.k_len, kBlockN), first_group = s.batch * s.heads % head_group;
    int block = blockIdx.x, bh0 = 0, group = first_group ? first_group : head_group;
    if (first_group && block >= first_group * key_blocks) {
      block -= first_group * key_blocks;
      bh0 = first_group;
      group = head_group;
    }
    const int in_group = block % (group * key_blocks);
    const int bh = bh0 + block / (group * key_blocks) * group + in_group % group, b = bh / s.heads, h = bh % s.heads;
    const int n0 = in_group / group * kBlockN;
    const QueryRows<T, kD> qrows = query_rows<kD>(q, dout, lse, delta, dq_accum, s, b, h, bh);

    // Starts copying query block m into `stage`: Q, dO, lse, delta. Rows past the end read
    // as zeros: their dO is zero, so whatever their P, they add nothing to any gradient.
    auto load_query_block = [&](int m, int stage) {
      const int m0 = m * kBlockM;
      load_panels_async<kBlockM, kD, kThreads>(sQ + stage * kBlockM * kD, qrows.q + m0 * q.row_stride, q.row_stride,
                                               s.q_len - m0, tid);
      load_panels_async<kBlockM, kD, kThreads>(sdO + stage * kBlockM * kD, qrows.dout + m0 * dout.row_stride,
                                               dout.row_stride, s.q_len - m0, tid);
      const int row = tid % kBlockM;
      const bool valid = m0 + row < s.q_len;
      if (tid < kBlockM)
        cp_async_4(sLse + stage * kBlockM + row, valid ? qrows.lse + m0 + row : qrows.lse, valid);
      else if (tid < 2 * kBlockM)
        cp_async_4(sDelta + stage * kBlockM + row, valid ? qrows.delta + m0 + row : qrows.delta, valid);
    };
    // Thread 0 starts adding query block m's dQ, complete in dQ tile `buffer`, into the sums:
    // the rows before q_len, whole 256-byte rows, contiguous in dq_accum.
    auto reduce_dq = [&](int m, int buffer) {
      const int m0 = m * kBlockM, rows = min(kBlockM, s.q_len - m0);
      bulk_reduce_add_f32(qrows.dq_accum + static_cast<int64_t>(m0) * kD, sdQ + buffer * kBlockM * kD,
                          static_cast<uint32_t>(rows * kD * 4));
      bulk_commit();
    };

    // Causal: queries before n0 see none of these keys.
    const int m_begin = s.causal ? n0 / kBlockM : 0, m_end = ceil_div(s.q_len, kBlockM);
    load_panels_async<kBlockN, kD, kThreads>(sK, k.matrix(b, h) + n0 * k.row_stride, k.row_stride, s.k_len - n0, tid);
    load_panels_async<kBlockN, kD, kThreads>(sV, v.matrix(b, h) + n0 * v.row_stride, v.row_stride, s.k_len - n0, tid);
    if (m_begin < m_end) load_query_block(m_begin, 0);
    cp_async_commit();
    if (m_begin + 1 < m_end) load_query_block(m_begin + 1, 1);
    cp_async_commit();

    float dk_acc[kD / 2], dv_acc[kD / 2];  // the warpgroup's keys x kD, unscaled dK and dV
#pragma unroll
    for (int i = 0; i < kD / 2; ++i) dk_acc[i] = dv_acc[i] = 0.f;
    float st[kBlockM / 2], dpt[kBlockM / 2];             // S^T then P^T; dP^T then dS^T
    float dq[kD / 4];                                    // 64 queries x 32 columns of dQ
    uint32_t pt[kBlockM / 16][4], dst[kBlockM / 16][4];  // P^T, dS^T as A registers

    // The step of query block m, in `stage`: on entry S^T of block m is running (the newest
    // wgmma group), block m + 1 is landing in the next stage. Unless it is the last step, it
    // leaves S^T of block m + 1 running.
    auto step = [&](int m, int stage, auto last) {
      constexpr bool kLast = decltype(last)::value;
      const int m0 = m * kBlockM, buffer = (m - m_begin) & 1;  // its dS^T and dQ tiles
      const int next = stage + 1 == kStages ? 0 : stage + 1, after = next + 1 == kStages ? 0 : next + 1;
      const T* sQs = sQ + stage * kBlockM * kD;
      const T* sdOs = sdO + stage * kBlockM * kD;
      const float* lse_s = sLse + stage * kBlockM;
      const float* delta_s = sDelta + stage * kBlockM;
      T* sdSt_m = sdSt + buffer * kBlockN * kBlockM;

      wgmma_wait<0>();
      fence_registers(st);
      wgmma_fence();
      issue_scores<T, kD, kBlockM, kBlockN>(dpt, sV, key_row0, sdOs);  // dP^T = V dO^T
      wgmma_commit();
      // Keys past the end, and keys after a query (causal), get probability 0.
      const bool mask = n0 + kBlockN > s.k_len || (s.causal && n0 + key_row0 + 63 > m0);
#pragma unroll
      for (int j = 0; j < kBlockM / 8; ++j) {
        const float2 row_lse = *reinterpret_cast<const float2*>(lse_s + 8 * j + col);
        const float lse_log2[2] = {row_lse.x * kLog2e, row_lse.y * kLog2e};
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int key = n0 + thread_key0 + 8 * (e >> 1), query = m0 + 8 * j + col + (e & 1);
          const bool masked = mask & ((key >= s.k_len) | (s.causal & (key > query)));
          st[4 * j + e] = exp2_fast(masked ? -INFINITY : st[4 * j + e] * s.scale_log2 - lse_log2[e & 1]);
        }
      }
      accumulators_to_a<T, kBlockM>(pt, st);
      fence_registers(dv_acc);
      wgmma_fence();
      issue_values<T, kD, kBlockM>(dv_acc, pt, sdOs);  // dV += P^T dO
      wgmma_commit();

      wgmma_wait<1>();
      fence_registers(dpt);
#pragma unroll
      for (int j = 0; j < kBlockM / 8; ++j) {
        const float2 row_delta = *reinterpret_cast<const float2*>(delta_s + 8 * j + col);
#pragma unroll
        for (int e = 0; e < 4; ++e)
          dpt[4 * j + e] = st[4 * j + e] * (dpt[4 * j + e] - (e & 1 ? row_delta.y : row_delta.x));
      }
      accumulators_to_a<T, kBlockM>(dst, dpt);
      store_a_to_panels<T, kBlockN, kBlockM>(sdSt_m, key_row0, dst, tid);
      fence_registers(dk_acc);
      wgmma_fence();
      issue_values<T, kD, kBlockM>(dk_acc, dst, sQs);  // dK += dS^T Q
      wgmma_commit();

      // The barrier of the step (the top comment says what it orders).
      cp_async_wait<0>();
      if (tid == 0) bulk_wait_read<0>();
      fence_shared_for_tensor_cores();
      __syncthreads();
      if (tid == 0 && m > m_begin) reduce_dq(m - 1, buffer ^ 1);
      if (m + 2 < m_end) load_query_block(m + 2, after);
      cp_async_commit();

      fence_registers(dq);
      wgmma_fence();
      issue_transposed_product<T, kBlockN, kD / 2>(dq, sdSt_m, sK, 32 * warpgroup);  // dQ = dS K, half of D
      wgmma_commit();
      if constexpr (kLast) {
        wgmma_wait<0>();
      } else {
        issue_scores<T, kD, kBlockM, kBlockN>(st, sK, key_row0, sQ + next * kBlockM * kD);  // S^T = K Q^T, m + 1
        wgmma_commit();
        wgmma_wait<1>();  // all but S^T: dV, dK and dQ of block m
      }
      fence_registers(dq);
      fence_registers(dv_acc);
      fence_registers(dk_acc);

      // scale dQ into the block's dQ tile, row-major as the sums. Lanes 4g..4g+3 hold query
      // row g (and g + 8); in round i row g writes its column group (i + g) % 4, so that the
      // 16 lanes of a half-warp write all 32 banks once.
      float* tile_row = sdQ + buffer * kBlockM * kD + query_row0 * kD + 32 * warpgroup + col;
      const int g = lane / 4;
#pragma unroll
      for (int i = 0; i < kD / 16; ++i) {
        const int j = (i + g) % (kD / 16);  // dq[4j ..]: not a constant index, so select it
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          float pair[2];
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int r = 2 * half + e;
            const float even = j & 1 ? dq[4 + r] : dq[r], odd = j & 1 ? dq[12 + r] : dq[8 + r];
            pair[e] = (j & 2 ? odd : even) * s.scale;
          }
          *reinterpret_cast<float2*>(tile_row + 8 * half * kD + 8 * j) = make_float2(pair[0], pair[1]);
        }
      }
    };

    if (m_begin < m_end) {
      // K, V and the first query block landed; the first scores start.
      cp_async_wait<1>();
      fence_shared_for_tensor_cores();
      __syncthreads();
      wgmma_fence();
      issue_scores<T, kD, kBlockM, kBlockN>(st, sK, key_row0, sQ);  // S^T = K Q^T
      wgmma_commit();

      int stage = 0;
      for (int m = m_begin; m + 1 < m_end; ++m) {
        step(m, stage, std::false_type{});
        stage = stage + 1 == kStages ? 0 : stage + 1;
      }
      step(m_end - 1, stage, std::true_type{});

      // The last block's dQ tile; the reductions finish reading shared memory before the
      // block exits (their additions complete by the end of the grid).
      fence_shared_for_tensor_cores();
      __syncthreads();
      if (tid == 0) {
        reduce_dq(m_end - 1, (m_end - 1 - m_begin) & 1);
        bulk_wait_read<0>();
      }
    }

    // dK (scaled) and dV of this thread's keys.
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int key = n0 + thread_key0 + 8 * half;
      if (key >= s.k_len) continue;
      T* dk_row = dk.matrix(b, h) + key * dk.row_stride;
      T* dv_row = dv.matrix(b, h) + key * dv.row_stride;
#pragma unroll
      for (int j = 0; j < kD / 8; ++j) {
        *reinterpret_cast<uint32_t*>(dk_row + 8 * j + col) =
            pack2<T>(dk_acc[4 * j + 2 * half] * s.scale, dk_acc[4 * j + 2 * half + 1] * s.scale);
        *reinterpret_cast<uint32_t*>(dv_row + 8 * j + col) =
            pack2<T>(dv_acc[4 * j + 2 * half], dv_acc[4 * j + 2 * half + 1]);
      }
    }

    if constexpr (kSums) {
      // The column sums of the dK and dV just written, of the values as rounded: a thread's
      // two keys, then the 8 lanes of its columns (16 keys), then the 8 warps (128 keys) in
      // order through shared memory (the dS^T tiles: no product or copy reads them any more).
      float* sSums = reinterpret_cast<float*>(sdSt);  // [dK, dV][8 warps][kD]
      const int warp = tid / 32;
      __syncthreads();
#pragma unroll
      for (int j = 0; j < kD / 8; ++j) {
        float dk_sum[2] = {0.f, 0.f}, dv_sum[2] = {0.f, 0.f};
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          if (n0 + thread_key0 + 8 * half >= s.k_len) continue;
          const float2 dk_rounded =
              unpack2<T>(pack2<T>(dk_acc[4 * j + 2 * half] * s.scale, dk_acc[4 * j + 2 * half + 1] * s.scale));
          const float2 dv_rounded = unpack2<T>(pack2<T>(dv_acc[4 * j + 2 * half], dv_acc[4 * j + 2 * half + 1]));
          dk_sum[0] += dk_rounded.x, dk_sum[1] += dk_rounded.y;
          dv_sum[0] += dv_rounded.x, dv_sum[1] += dv_rounded.y;
        }
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          dk_sum[e] = sum_over_fragment_rows(dk_sum[e]);
          dv_sum[e] = sum_over_fragment_rows(dv_sum[e]);
          if (lane < 4) {
            sSums[warp * kD + 8 * j + col + e] = dk_sum[e];
            sSums[(kThreads / 32 + warp) * kD + 8 * j + col + e] = dv_sum[e];
          }
        }
      }
      __syncthreads();
      if (tid < 2 * kD) {
        const int part = tid / kD, c = tid % kD;  // part 0: dK, 1: dV
        float sum = 0.f;
#pragma unroll
        for (int w = 0; w < kThreads / 32; ++w) sum += sSums[(part * (kThreads / 32) + w) * kD + c];
        const int64_t row = static_cast<int64_t>(b) * key_blocks + n0 / kBlockN;
        kv_partial[(row * 2 + part) * s.heads * kD + h * kD + c] = sum;
      }
    }
  }
}

}  // namespace

bool flash_attention_backward_sm90_supported(const Tensor& q) {
  return (q.dtype() == DType::bf16 || q.dtype() == DType::f16) && q.dim() == 4 && q.size(3) == kD &&
         sm90a_code_loaded(q.device());
}

void flash_backward_key_blocks_sm90(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& dout,
                                    const Tensor& lse, const Tensor& delta, const Tensor& dq_accum, bool causal,
                                    double scale, const Tensor& dk, const Tensor& dv, const Tensor& kv_partial) {
  const char* op = "flash_attention backward (sm_90a)";
  PRECIS_CHECK(flash_attention_backward_sm90_supported(q), op,
               ": needs a compute-capability 9.0 GPU, f16 or bf16, head size 64");
  const Sizes s = sizes_of(q, k, causal, scale);
  if (s.batch == 0 || s.heads == 0 || s.k_len == 0) return;
  cudaStream_t stream = stream_for(q);
  // The blocks in the order the GPU starts them: heads in groups, in a group key blocks
  // slowest and heads fastest. Causal, a group's first key blocks walk the most queries; of
  // a few heads at a time, their Q, dO and dQ sums stay in L2 while all their key blocks
  // read and add into them. ceil(4 SMs / (key_blocks + 1)) heads give each multiprocessor
  // twice the longest block's steps (2 key_blocks) of work in a group (about group *
  // key_blocks^2 steps), so that the last group's long blocks even out; at most 16, since
  // short blocks even out anyway and fewer heads stay in L2. H100, bf16, causal, 16384
  // tokens, forward and backward ms with groups of 1, 4, 16, 64 and all heads: T = 512
  // 0.306, 0.304, 0.304, 0.310, 0.344; T = 1024 0.416, 0.415, 0.406, 0.415, 0.477; T = 4096
  // 1.128, 1.059, 1.069, 1.105, 1.092; T = 16384 3.721, 3.733, 3.759, 3.785, 3.767 (and 3.722
  // with 5, this rule's). Not causal, every key block walks all queries from the first:
  // heads fastest keeps one head's blocks from adding into the same dQ rows at once.
  const int heads = s.batch * s.heads, key_blocks = ceil_div(s.k_len, kBlockN);
  const int head_group =
      s.causal ? std::clamp(std::min(ceil_div(4 * multiprocessor_count(q.device()), key_blocks + 1), 16), 1, heads)
               : heads;
  if (kv_partial.defined())
    PRECIS_CHECK(kv_partial.dtype() == DType::f32 && kv_partial.is_contiguous() &&
                     kv_partial.numel() == static_cast<int64_t>(s.batch) * key_blocks * 2 * s.heads * kD,
                 op, ": the dK, dV column partials ", describe(kv_partial), " must be dense f32 [",
                 s.batch * key_blocks, ", ", 2 * s.heads * kD, "]");
  dispatch_half(q.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    auto launch = [&](auto kernel) {
      launch_with_shared_memory(kernel, heads * key_blocks, kThreads, kSmemBytes, stream, op, heads_view<const T>(q),
                                heads_view<const T>(k), heads_view<const T>(v), heads_view<const T>(dout),
                                static_cast<const float*>(lse.raw_data()), static_cast<const float*>(delta.raw_data()),
                                static_cast<float*>(dq_accum.raw_data()), heads_view<T>(dk), heads_view<T>(dv), s,
                                head_group,
                                kv_partial.defined() ? static_cast<float*>(kv_partial.raw_data()) : nullptr);
    };
    if (kv_partial.defined())
      launch(flash_backward_sm90_kernel<T, true>);
    else
      launch(flash_backward_sm90_kernel<T, false>);
  });
  PRECIS_CUDA_CHECK_LAUNCH(op);
}

}  // namespace precis::ops::cuda
