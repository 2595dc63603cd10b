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
// from the one holding the block's first key). Per query block, each warpgroup:
//   issue  S^T = K Q^T, dP^T = V dO^T           (A = K or V tile, B = Q or dO tile, K-major)
//   wait for S^T; P^T = exp2(S^T scale log2 e - lse log2 e), masked where needed
//   issue  dV += P^T dO                          (A = P^T in registers, B = dO tile MN-major)
//   wait for dP^T; dS^T = P^T (dP^T - delta)
//   issue  dK += dS^T Q                          (A = dS^T in registers, B = Q tile MN-major)
//   store dS^T into a shared [128 keys][64 queries] tile; barrier (both warpgroups' halves)
//   issue  dQ[:, 32w..32w+31] = dS K             (A = that tile read transposed, B = K tile
//                                                 MN-major, columns 32w..32w+31)
//   wait; add scale dQ into the f32 dQ sums with atomics
// lse and delta index the accumulators' columns (queries). The exponentials of P^T overlap
// dP^T's product, and dS^T's arithmetic the dV product.
// Tiles: K and V once; Q, dO, lse, delta in two stages, loaded with cp.async by all threads
// one query block ahead; the barrier that opens a query block hands its landed tiles to both
// warpgroups and frees the stage and the dS^T tile read last time.
//
// Registers: 254 a thread, no spills (one block per SM). H100, bf16, causal, D = 64, 16384
// tokens, the whole backward (delta and dQ-rounding kernels included) against the mma.sync
// one in the same run: 0.402 -> 0.385 ms at T = 1024, 1.045 -> 0.953 ms at T = 4096,
// 3.62 -> 3.32 ms at T = 16384; the three products per step that wait on each other (S^T or
// dP^T, then dV or dK, then dQ after a barrier) leave the tensor cores idle between them.
//
// Memory traffic per (b, h): K, V, dK, dV once; Q, dO, lse, delta once per key block; the
// f32 dQ sums read-modify-written once per key block (atomics). Arithmetic: 5 products of
// 2 Tq Tk D flops each (half skipped when causal), Tq Tk exponentials.
//
// The code assembles only in the sm_90a pass (CMakeLists.txt); the sm_80 and sm_90 passes
// compile an empty kernel, and flash_attention_backward_sm90_supported checks that the
// driver loaded the sm_90a code.
#include "ops/cuda/flash_attention_sm90.h"
#include "ops/cuda/flash_params.cuh"
#include "ops/cuda/flash_wgmma.cuh"
#include "ops/cuda/tensor_info.cuh"

namespace precis::ops::cuda {

namespace {

using namespace flash;

constexpr int kD = 64, kWarpgroups = 2, kThreads = 128 * kWarpgroups;
constexpr int kBlockN = 64 * kWarpgroups, kBlockM = 64;  // keys per block; queries per step
constexpr float kLog2e = 1.4426950408889634f;
// K, V, dS^T [kBlockN][kD]; two stages of Q, dO [kBlockM][kD] and of lse, delta [kBlockM];
// room to start the tiles on a 1024-byte boundary.
constexpr int kTileBytes = kBlockN * kD * 2, kStageBytes = kBlockM * kD * 2;
constexpr int kSmemBytes = 3 * kTileBytes + 4 * kStageBytes + 4 * kBlockM * 4 + kSwizzleAtomBytes;

template <typename T>
__global__ void __launch_bounds__(kThreads, 1)
    flash_backward_sm90_kernel(HeadsView<const T> q, HeadsView<const T> k, HeadsView<const T> v,
                               HeadsView<const T> dout, const float* lse, const float* delta, float* dq_accum,
                               HeadsView<T> dk, HeadsView<T> dv, Sizes s) {
  if constexpr (kSm90aPass) {
    extern __shared__ unsigned char smem_raw[];
    T* sK = reinterpret_cast<T*>((reinterpret_cast<uintptr_t>(smem_raw) + kSwizzleAtomBytes - 1) &
                                 ~uintptr_t(kSwizzleAtomBytes - 1));
    T* sV = sK + kBlockN * kD;
    T* sdSt = sV + kBlockN * kD;                                     // [kBlockN keys][kBlockM queries]
    T* sQ = sdSt + kBlockN * kD;                                     // [2][kBlockM * kD]
    T* sdO = sQ + 2 * kBlockM * kD;                                  // [2][kBlockM * kD]
    float* sLse = reinterpret_cast<float*>(sdO + 2 * kBlockM * kD);  // [2][kBlockM]
    float* sDelta = sLse + 2 * kBlockM;                              // [2][kBlockM]

    const int tid = threadIdx.x, warpgroup = tid / 128, lane = tid % 32;
    const int key_row0 = 64 * warpgroup;                                // the warpgroup's first key in the block
    const int thread_key0 = key_row0 + 16 * (tid / 32 % 4) + lane / 4;  // this thread's keys: +0 and +8
    const int col = 2 * (lane % 4);                                     // its first column in each 8
    const int bh = blockIdx.x, b = bh / s.heads, h = bh % s.heads;
    const int n0 = blockIdx.y * kBlockN;
    const T* qm = q.matrix(b, h);
    const T* dom = dout.matrix(b, h);
    const float* lse_bh = lse + static_cast<int64_t>(bh) * s.q_len;
    const float* delta_bh = delta + static_cast<int64_t>(bh) * s.q_len;
    float* dq_bh = dq_accum + static_cast<int64_t>(bh) * s.q_len * kD;

    // Starts copying query block m into `stage`: Q, dO, lse, delta. Rows past the end read
    // as zeros: their dO is zero, so whatever their P, they add nothing to any gradient.
    auto load_query_block = [&](int m, int stage) {
      const int m0 = m * kBlockM;
      load_panels_async<kBlockM, kD, kThreads>(sQ + stage * kBlockM * kD, qm + m0 * q.row_stride, q.row_stride,
                                               s.q_len - m0, tid);
      load_panels_async<kBlockM, kD, kThreads>(sdO + stage * kBlockM * kD, dom + m0 * dout.row_stride, dout.row_stride,
                                               s.q_len - m0, tid);
      const int row = tid % kBlockM;
      const bool valid = m0 + row < s.q_len;
      if (tid < kBlockM)
        cp_async_4(sLse + stage * kBlockM + row, valid ? lse_bh + m0 + row : lse_bh, valid);
      else if (tid < 2 * kBlockM)
        cp_async_4(sDelta + stage * kBlockM + row, valid ? delta_bh + m0 + row : delta_bh, valid);
    };

    // Causal: queries before n0 see none of these keys.
    const int m_begin = s.causal ? n0 / kBlockM : 0, m_end = ceil_div(s.q_len, kBlockM);
    load_panels_async<kBlockN, kD, kThreads>(sK, k.matrix(b, h) + n0 * k.row_stride, k.row_stride, s.k_len - n0, tid);
    load_panels_async<kBlockN, kD, kThreads>(sV, v.matrix(b, h) + n0 * v.row_stride, v.row_stride, s.k_len - n0, tid);
    if (m_begin < m_end) load_query_block(m_begin, 0);
    cp_async_commit();

    float dk_acc[kD / 2], dv_acc[kD / 2];  // the warpgroup's keys x kD, unscaled dK and dV
#pragma unroll
    for (int i = 0; i < kD / 2; ++i) dk_acc[i] = dv_acc[i] = 0.f;
    float st[kBlockM / 2], dpt[kBlockM / 2];             // S^T then P^T; dP^T then dS^T
    float dq[kD / 4];                                    // 64 queries x 32 columns of dQ
    uint32_t pt[kBlockM / 16][4], dst[kBlockM / 16][4];  // P^T, dS^T as A registers

    for (int m = m_begin; m < m_end; ++m) {
      const int m0 = m * kBlockM, stage = (m - m_begin) % 2;
      // Block m landed and is visible to every warpgroup's wgmmas; every thread is past the
      // wgmmas of block m - 1, so its stage and the dS^T tile may be refilled.
      cp_async_wait<0>();
      fence_shared_for_tensor_cores();
      __syncthreads();
      if (m + 1 < m_end) load_query_block(m + 1, stage ^ 1);
      cp_async_commit();
      const T* sQs = sQ + stage * kBlockM * kD;
      const T* sdOs = sdO + stage * kBlockM * kD;
      const float* lse_s = sLse + stage * kBlockM;
      const float* delta_s = sDelta + stage * kBlockM;

      wgmma_fence();
      issue_scores<T, kD, kBlockM, kBlockN>(st, sK, key_row0, sQs);  // S^T = K Q^T
      wgmma_commit();
      issue_scores<T, kD, kBlockM, kBlockN>(dpt, sV, key_row0, sdOs);  // dP^T = V dO^T
      wgmma_commit();

      wgmma_wait<1>();
      fence_registers(st);
      // Keys past the end, and keys after a query (causal), get probability 0.
      const bool mask = n0 + kBlockN > s.k_len || (s.causal && n0 + key_row0 + 63 > m0);
#pragma unroll
      for (int j = 0; j < kBlockM / 8; ++j) {
        const float2 row_lse = *reinterpret_cast<const float2*>(lse_s + 8 * j + col);
        const float lse_log2[2] = {row_lse.x * kLog2e, row_lse.y * kLog2e};
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          float x = st[4 * j + e] * s.scale_log2 - lse_log2[e & 1];
          if (mask) {
            const int key = n0 + thread_key0 + 8 * (e >> 1), query = m0 + 8 * j + col + (e & 1);
            if (key >= s.k_len || (s.causal && key > query)) x = -INFINITY;
          }
          st[4 * j + e] = exp2_fast(x);
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
      store_a_to_panels<T, kBlockN, kBlockM>(sdSt, key_row0, dst, tid);
      fence_shared_for_tensor_cores();
      fence_registers(dk_acc);
      wgmma_fence();
      issue_values<T, kD, kBlockM>(dk_acc, dst, sQs);  // dK += dS^T Q
      wgmma_commit();

      __syncthreads();  // both warpgroups' dS^T are in the tile
      fence_registers(dq);
      wgmma_fence();
      issue_transposed_product<T, kBlockN, kD / 2>(dq, sdSt, sK, 32 * warpgroup);  // dQ = dS K, half of D
      wgmma_commit();
      wgmma_wait<0>();
      fence_registers(dq);
      fence_registers(dv_acc);
      fence_registers(dk_acc);

      const int query0 = m0 + 16 * (tid / 32 % 4) + lane / 4;
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int query = query0 + 8 * half;
        if (query >= s.q_len) continue;
        float* dst_row = dq_bh + static_cast<int64_t>(query) * kD + 32 * warpgroup + col;
#pragma unroll
        for (int j = 0; j < kD / 16; ++j)
          atomic_add_pair(dst_row + 8 * j, dq[4 * j + 2 * half] * s.scale, dq[4 * j + 2 * half + 1] * s.scale);
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
  }
}

}  // namespace

bool flash_attention_backward_sm90_supported(const Tensor& q) {
  return (q.dtype() == DType::bf16 || q.dtype() == DType::f16) && q.dim() == 4 && q.size(3) == kD &&
         sm90a_code_loaded(q.device());
}

void flash_backward_key_blocks_sm90(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& dout,
                                    const Tensor& lse, const Tensor& delta, const Tensor& dq_accum, bool causal,
                                    double scale, const Tensor& dk, const Tensor& dv) {
  const char* op = "flash_attention backward (sm_90a)";
  PRECIS_CHECK(flash_attention_backward_sm90_supported(q), op,
               ": needs a compute-capability 9.0 GPU, f16 or bf16, head size 64");
  const Sizes s = sizes_of(q, k, causal, scale);
  if (s.batch == 0 || s.heads == 0 || s.k_len == 0) return;
  cudaStream_t stream = stream_for(q);
  const dim3 grid(s.batch * s.heads, ceil_div(s.k_len, kBlockN));
  auto launch = [&](auto tag) {
    using T = decltype(tag);
    auto kernel = flash_backward_sm90_kernel<T>;
    PRECIS_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes), op);
    kernel<<<grid, kThreads, kSmemBytes, stream>>>(
        heads_view<const T>(q), heads_view<const T>(k), heads_view<const T>(v), heads_view<const T>(dout),
        static_cast<const float*>(lse.raw_data()), static_cast<const float*>(delta.raw_data()),
        static_cast<float*>(dq_accum.raw_data()), heads_view<T>(dk), heads_view<T>(dv), s);
  };
  if (q.dtype() == DType::bf16)
    launch(__nv_bfloat16{});
  else
    launch(__half{});
  PRECIS_CUDA_CHECK_LAUNCH(op);
}

}  // namespace precis::ops::cuda
