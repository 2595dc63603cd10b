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
//   1. delta_i = rowsum(dO * O)                                    reads 2 Tq D values
//   2. one thread block per block of kBlockN keys: keeps K, V and the dK, dV sums of
//      its keys on chip and walks the query blocks (causal: from the diagonal on),
//      recomputing S, P, dP, dS there. dK, dV are written once at the end; dQ gets
//      each key block's contribution added into an f32 buffer with atomics (so the
//      order of those additions, and dQ's last bits, can vary between runs).
//   3. dQ = that f32 buffer rounded to q's dtype.
// Traffic per (b, h): K, V, dK, dV once; Q, dO, lse, delta once per key block; dQ's
// f32 buffer read-modify-written once per key block. Arithmetic: 5 products of
// 2 Tq Tk D flops each (S, dP, dV, dK, dQ), half of it skipped when causal.
//
// The block: 8 warps, 128 keys, query blocks of 64 rows. For S and dP each warp owns
// 16 query rows x 64 keys; P and dS go to shared memory (16-bit), where the transposed
// reads for dV and dK (each warp owns 16 keys) and the dQ product (each warp: 16 rows,
// half the head columns) find them. The next query block's Q and dO load (cp.async)
// while this one computes. 128 keys per block halve the dQ atomics and the Q/dO
// reloads of 64-key blocks.
#include "ops/cuda/flash_attention.h"
#include "ops/cuda/flash_mma.cuh"
#include "ops/cuda/flash_params.cuh"
#include "ops/cuda/tensor_info.cuh"

namespace precis::ops::cuda {

namespace {

using namespace flash;

constexpr int kThreads = 256, kBlockM = 64, kBlockN = 128;  // 8 warps
constexpr float kLog2e = 1.4426950408889634f;

// ---- 1. delta_i = sum_d dO_id O_id, kD / 8 threads per row (16-byte loads), f32.

template <typename T, int kD>
__global__ void flash_delta_kernel(HeadsView<const T> out, HeadsView<const T> dout, float* delta, Sizes s,
                                   int64_t rows) {
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
  }
#pragma unroll
  for (int offset = kLanesPerRow / 2; offset > 0; offset /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, offset);
  if (row < rows && col == 0) delta[row] = acc;
}

// ---- 2. dK, dV of one key block, and its share of dQ.

template <int kD>
struct BackwardTile {
  // K, V [kBlockN][kD]; Q, dO [kBlockM][kD] twice (the next query block loads while this
  // one computes); P, dS [kBlockM][kBlockN], all 16-bit; lse, delta rows in f32, twice.
  static constexpr int kSmemBytes =
      (2 * kBlockN + 4 * kBlockM) * kD * 2 + 2 * kBlockM * kBlockN * 2 + 4 * kBlockM * 4;
};

template <typename T, int kD>
__global__ void __launch_bounds__(kThreads)
    flash_backward_kernel(HeadsView<const T> q, HeadsView<const T> k, HeadsView<const T> v, HeadsView<const T> dout,
                          const float* lse, const float* delta, float* dq_accum, HeadsView<T> dk, HeadsView<T> dv,
                          Sizes s) {
  extern __shared__ __align__(16) unsigned char smem[];
  T* sK = reinterpret_cast<T*>(smem);
  T* sV = sK + kBlockN * kD;
  T* sQ = sV + kBlockN * kD;  // [2][kBlockM * kD]
  T* sdO = sQ + 2 * kBlockM * kD;
  T* sP = sdO + 2 * kBlockM * kD;
  T* sdS = sP + kBlockM * kBlockN;
  float* sLse = reinterpret_cast<float*>(sdS + kBlockM * kBlockN);  // [2][kBlockM], log2 units
  float* sDelta = sLse + 2 * kBlockM;                               // [2][kBlockM]

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int bh = blockIdx.x, b = bh / s.heads, h = bh % s.heads;
  const int n0 = blockIdx.y * kBlockN;
  const T* qm = q.matrix(b, h);
  const T* dom = dout.matrix(b, h);
  const float* lse_bh = lse + static_cast<int64_t>(bh) * s.q_len;
  const float* delta_bh = delta + static_cast<int64_t>(bh) * s.q_len;
  float* dq_bh = dq_accum + static_cast<int64_t>(bh) * s.q_len * kD;

  // Starts loading query block m into buffer `buf`: Q, dO (cp.async) and lse, delta.
  auto load_query_block = [&](int m, int buf) {
    const int m0 = m * kBlockM;
    load_tile_async<kBlockM, kD, kThreads>(sQ + buf * kBlockM * kD, qm + m0 * q.row_stride, q.row_stride,
                                           s.q_len - m0, tid);
    load_tile_async<kBlockM, kD, kThreads>(sdO + buf * kBlockM * kD, dom + m0 * dout.row_stride, dout.row_stride,
                                           s.q_len - m0, tid);
    if (tid < kBlockM) {
      const int row = m0 + tid;
      // Rows past the end: lse +inf makes their P zero.
      sLse[buf * kBlockM + tid] = row < s.q_len ? lse_bh[row] * kLog2e : INFINITY;
      sDelta[buf * kBlockM + tid] = row < s.q_len ? delta_bh[row] : 0.f;
    }
  };

  // Causal: queries before n0 see none of these keys.
  const int m_begin = s.causal ? n0 / kBlockM : 0, m_end = ceil_div(s.q_len, kBlockM);
  load_tile_async<kBlockN, kD, kThreads>(sK, k.matrix(b, h) + n0 * k.row_stride, k.row_stride, s.k_len - n0, tid);
  load_tile_async<kBlockN, kD, kThreads>(sV, v.matrix(b, h) + n0 * v.row_stride, v.row_stride, s.k_len - n0, tid);
  if (m_begin < m_end) load_query_block(m_begin, 0);
  cp_async_commit();

  // Warp roles. S, dP: query rows row0 .. +16 against keys key0 .. +64. dK, dV: keys
  // warp*16 .. +16. dQ: query rows row0 .. +16, head columns col0 .. + kD/2.
  const int row0 = (warp % 4) * 16, key0 = (warp / 4) * 64, col0 = (warp / 4) * (kD / 2);
  float dv_acc[kD / 8][4], dk_acc[kD / 8][4];
#pragma unroll
  for (int dt = 0; dt < kD / 8; ++dt)
#pragma unroll
    for (int e = 0; e < 4; ++e) dv_acc[dt][e] = dk_acc[dt][e] = 0.f;

  for (int m = m_begin; m < m_end; ++m) {
    const int m0 = m * kBlockM, buf = (m - m_begin) & 1;
    cp_async_wait<0>();
    __syncthreads();  // block m is in buffer `buf`; every warp is done with block m - 1
    if (m + 1 < m_end) {
      load_query_block(m + 1, buf ^ 1);
      cp_async_commit();
    }
    const T* sQb = sQ + buf * kBlockM * kD;
    const T* sdOb = sdO + buf * kBlockM * kD;

    // S = Q K^T and dP = dO V^T for the warp's 16 query rows and 64 keys.
    float sc[8][4], dp[8][4];
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) sc[nt][e] = dp[nt][e] = 0.f;
#pragma unroll
    for (int ks = 0; ks < kD / 16; ++ks) {
      uint32_t qa[4], da[4];
      load_a<kD>(qa, sQb, row0, ks * 16, lane);
      load_a<kD>(da, sdOb, row0, ks * 16, lane);
#pragma unroll
      for (int np = 0; np < 4; ++np) {
        uint32_t kb[4], vb[4];
        load_b_from_rows<kD>(kb, sK, key0 + np * 16, ks * 16, lane);
        load_b_from_rows<kD>(vb, sV, key0 + np * 16, ks * 16, lane);
        mma_16816<T>(sc[2 * np], qa, kb[0], kb[1]);
        mma_16816<T>(sc[2 * np + 1], qa, kb[2], kb[3]);
        mma_16816<T>(dp[2 * np], da, vb[0], vb[1]);
        mma_16816<T>(dp[2 * np + 1], da, vb[2], vb[3]);
      }
    }

    // P = exp(S - lse) (0 where masked), dS = P (dP - delta), both to shared memory.
    const bool needs_mask = n0 + kBlockN > s.k_len || (s.causal && n0 + kBlockN - 1 > m0);
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int local_row = row0 + lane / 4 + 8 * half, query = m0 + local_row;
      const float row_lse = sLse[buf * kBlockM + local_row], row_delta = sDelta[buf * kBlockM + local_row];
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) {
        const int local_key = key0 + nt * 8 + 2 * (lane % 4);
        float p[2], ds[2];
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int key = n0 + local_key + e;
          const bool visible = !needs_mask || (key < s.k_len && (!s.causal || key <= query));
          p[e] = visible ? exp2f(sc[nt][2 * half + e] * s.scale_log2 - row_lse) : 0.f;
          ds[e] = p[e] * (dp[nt][2 * half + e] - row_delta);
        }
        *reinterpret_cast<uint32_t*>(sP + swizzled<kBlockN>(local_row, local_key)) = pack2<T>(p[0], p[1]);
        *reinterpret_cast<uint32_t*>(sdS + swizzled<kBlockN>(local_row, local_key)) = pack2<T>(ds[0], ds[1]);
      }
    }
    __syncthreads();

    // dV += P^T dO and dK += dS^T Q for the warp's 16 keys.
#pragma unroll
    for (int ks = 0; ks < kBlockM / 16; ++ks) {
      uint32_t pa[4], dsa[4];
      load_a_transposed<kBlockN>(pa, sP, ks * 16, warp * 16, lane);
      load_a_transposed<kBlockN>(dsa, sdS, ks * 16, warp * 16, lane);
#pragma unroll
      for (int dp2 = 0; dp2 < kD / 16; ++dp2) {
        uint32_t ob[4], qb[4];
        load_b_from_cols<kD>(ob, sdOb, ks * 16, dp2 * 16, lane);
        load_b_from_cols<kD>(qb, sQb, ks * 16, dp2 * 16, lane);
        mma_16816<T>(dv_acc[2 * dp2], pa, ob[0], ob[1]);
        mma_16816<T>(dv_acc[2 * dp2 + 1], pa, ob[2], ob[3]);
        mma_16816<T>(dk_acc[2 * dp2], dsa, qb[0], qb[1]);
        mma_16816<T>(dk_acc[2 * dp2 + 1], dsa, qb[2], qb[3]);
      }
    }

    // dQ[rows] += scale dS K over the block's kBlockN keys, 16 columns at a time, added atomically.
#pragma unroll
    for (int dp2 = 0; dp2 < kD / 32; ++dp2) {
      const int col = col0 + dp2 * 16;
      float dq[2][4] = {};
#pragma unroll
      for (int ks = 0; ks < kBlockN / 16; ++ks) {
        uint32_t a[4], kb[4];
        load_a<kBlockN>(a, sdS, row0, ks * 16, lane);
        load_b_from_cols<kD>(kb, sK, ks * 16, col, lane);
        mma_16816<T>(dq[0], a, kb[0], kb[1]);
        mma_16816<T>(dq[1], a, kb[2], kb[3]);
      }
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int row = m0 + row0 + lane / 4 + 8 * half;
        if (row >= s.q_len) continue;
#pragma unroll
        for (int t = 0; t < 2; ++t) {
          float* dst = dq_bh + static_cast<int64_t>(row) * kD + col + t * 8 + 2 * (lane % 4);
          atomicAdd(dst, dq[t][2 * half] * s.scale);
          atomicAdd(dst + 1, dq[t][2 * half + 1] * s.scale);
        }
      }
    }
  }

  // dK (scaled) and dV of the warp's 16 keys.
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int key = n0 + warp * 16 + lane / 4 + 8 * half;
    if (key >= s.k_len) continue;
    T* dk_row = dk.matrix(b, h) + key * dk.row_stride;
    T* dv_row = dv.matrix(b, h) + key * dv.row_stride;
#pragma unroll
    for (int dt = 0; dt < kD / 8; ++dt) {
      const int col = dt * 8 + 2 * (lane % 4);
      *reinterpret_cast<uint32_t*>(dk_row + col) =
          pack2<T>(dk_acc[dt][2 * half] * s.scale, dk_acc[dt][2 * half + 1] * s.scale);
      *reinterpret_cast<uint32_t*>(dv_row + col) = pack2<T>(dv_acc[dt][2 * half], dv_acc[dt][2 * half + 1]);
    }
  }
}

// ---- 3. dQ = the f32 sums rounded to q's dtype, 8 values per thread.

template <typename T, int kD>
__global__ void flash_dq_kernel(const float* dq_accum, HeadsView<T> dq, Sizes s, int64_t chunks) {
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

template <typename T, int kD>
void launch_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                     const Tensor& dout, const Sizes& s, const Tensor& dq, const Tensor& dk, const Tensor& dv,
                     cudaStream_t stream) {
  const char* op = "flash_attention backward";
  const int64_t rows = static_cast<int64_t>(s.batch) * s.heads * s.q_len;
  Tensor delta = empty({rows}, DType::f32, q.device());
  Tensor dq_accum = empty({rows, kD}, DType::f32, q.device());
  PRECIS_CUDA_CHECK(cudaMemsetAsync(dq_accum.raw_data(), 0, dq_accum.nbytes(), stream), op);

  constexpr int kElementwiseThreads = 256;
  const int64_t chunks = rows * (kD / 8);
  const unsigned chunk_blocks = static_cast<unsigned>((chunks + kElementwiseThreads - 1) / kElementwiseThreads);
  flash_delta_kernel<T, kD><<<chunk_blocks, kElementwiseThreads, 0, stream>>>(
      heads_view<const T>(out), heads_view<const T>(dout), static_cast<float*>(delta.raw_data()), s, rows);
  PRECIS_CUDA_CHECK_LAUNCH(op);

  auto kernel = flash_backward_kernel<T, kD>;
  constexpr int kSmem = BackwardTile<kD>::kSmemBytes;
  PRECIS_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem), op);
  const dim3 grid(s.batch * s.heads, ceil_div(s.k_len, kBlockN));
  kernel<<<grid, kThreads, kSmem, stream>>>(heads_view<const T>(q), heads_view<const T>(k), heads_view<const T>(v),
                                           heads_view<const T>(dout), static_cast<const float*>(lse.raw_data()),
                                           static_cast<const float*>(delta.raw_data()),
                                           static_cast<float*>(dq_accum.raw_data()), heads_view<T>(dk),
                                           heads_view<T>(dv), s);
  PRECIS_CUDA_CHECK_LAUNCH(op);

  flash_dq_kernel<T, kD><<<chunk_blocks, kElementwiseThreads, 0, stream>>>(
      static_cast<const float*>(dq_accum.raw_data()), heads_view<T>(dq), s, chunks);
  PRECIS_CUDA_CHECK_LAUNCH(op);
}

}  // namespace

void flash_attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                              const Tensor& lse, const Tensor& dout, bool causal, double scale, const Tensor& dq,
                              const Tensor& dk, const Tensor& dv) {
  const char* op = "flash_attention backward";
  const Sizes s = sizes_of(q, k, causal, scale);
  if (s.batch == 0 || s.heads == 0 || s.k_len == 0) return;
  cudaStream_t stream = stream_for(q);
  const int64_t D = q.size(3);
  auto by_dim = [&](auto tag) {
    using T = decltype(tag);
    if (D == 64)
      launch_backward<T, 64>(q, k, v, out, lse, dout, s, dq, dk, dv, stream);
    else if (D == 128)
      launch_backward<T, 128>(q, k, v, out, lse, dout, s, dq, dk, dv, stream);
    else
      PRECIS_FAIL(op, ": head size ", D, " is not supported (64 or 128)");
  };
  if (q.dtype() == DType::bf16)
    by_dim(__nv_bfloat16{});
  else if (q.dtype() == DType::f16)
    by_dim(__half{});
  else
    PRECIS_FAIL(op, ": dtype ", q.dtype(), " is not supported (f16 or bf16)");
}

}  // namespace precis::ops::cuda
