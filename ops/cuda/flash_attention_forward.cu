// Flash attention, forward (FlashAttention-2, Dao 2023), for f16/bf16 on sm_80+.
//
// What it computes, per batch b and head h, with S = scale * Q K^T ([Tq, Tk]):
//   O = softmax(S, masked) V        lse_i = log sum_j exp(S_ij)
// A plain implementation writes S and softmax(S) to memory: B*H*Tq*Tk values each
// (GPT-2 124M at B=16, T=1024: 200M per layer, 0.8 GB in f32), read back two or
// three times. Flash attention never forms them in memory.
//
// How: a thread block owns kBlockM query rows. It walks the keys in blocks of
// kBlockN, and for each block computes the scores S_blk = scale * Q_blk K_blk^T in
// registers and folds them into three running quantities per query row:
//   m   the largest score seen so far
//   l   sum_j exp(S_ij - m)            over the keys seen so far
//   acc sum_j exp(S_ij - m) V_j        (the unnormalised output)
// When a new block raises the maximum from m to m', the old sums are rescaled by
// exp(m - m') ("online softmax"), so at the end O_i = acc_i / l_i exactly, and
// lse_i = m_i + log l_i. Exponentials are exp2 of scores pre-scaled by log2(e), one
// ex2.approx.ftz each (exp2f would add three instructions per score for subnormals).
//
// Causal attention (query i sees keys j <= i) stops the walk at the diagonal: blocks
// wholly above it are skipped, not masked; only the diagonal and the ragged tail
// blocks (Tk not a multiple of kBlockN) mask scores to -inf.
//
// Memory traffic per (b, h): Q and O once (2 Tq D values), K and V once per query
// block (2 Tk D Tq / kBlockM values; causal about half), lse Tq floats. For GPT-2
// (T = 1024, D = 64, kBlockM = 128) that is ~11 MB per layer instead of the ~2.4 GB
// the plain path moves. Arithmetic: 4 Tq Tk D flops (half for causal) on tensor cores.
//
// The block: 4 warps, each owning 16 * kMTiles query rows, so the probabilities it
// computes (C fragments of S) feed its own P V products straight from registers.
// K and V tiles go through shared memory with cp.async: K of the next block loads
// while P V runs, V of this block loads while Q K^T runs. The output tile goes out
// through shared memory too (the Q tile's, free once Q is in registers), so every
// thread writes whole 16-byte pieces of rows instead of 4-byte scraps.
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

constexpr int kThreads = 128, kWarps = 4, kBlockN = 64;

template <int kD, int kMTiles>
struct ForwardTile {
  static constexpr int kBlockM = 16 * kMTiles * kWarps;
  // Q, K, V tiles of 16-bit values; the Q tile holds the output tile at the end.
  static constexpr int kSmemBytes = (kBlockM + 2 * kBlockN) * kD * 2;
};

template <typename T, int kD, int kMTiles>
__global__ void __launch_bounds__(kThreads)
    flash_forward_kernel(HeadsView<const T> q, HeadsView<const T> k, HeadsView<const T> v, HeadsView<T> out, float* lse,
                         Sizes s) {
  precis::cuda::wait_for_previous_grid();
  constexpr int kBlockM = ForwardTile<kD, kMTiles>::kBlockM;
  extern __shared__ __align__(16) unsigned char smem[];
  T* sQ = reinterpret_cast<T*>(smem);
  T* sK = sQ + kBlockM * kD;
  T* sV = sK + kBlockN * kD;

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int b = blockIdx.x / s.heads, h = blockIdx.x % s.heads;
  const int m0 = (gridDim.y - 1 - blockIdx.y) * kBlockM;  // the longest causal rows start first
  int n_blocks = ceil_div(s.k_len, kBlockN);
  if (s.causal) n_blocks = min(n_blocks, ceil_div(min(m0 + kBlockM, s.q_len), kBlockN));
  const T* km = k.matrix(b, h);
  const T* vm = v.matrix(b, h);

  load_tile_async<kBlockM, kD, kThreads>(sQ, q.matrix(b, h) + m0 * q.row_stride, q.row_stride, s.q_len - m0, tid);
  load_tile_async<kBlockN, kD, kThreads>(sK, km, k.row_stride, s.k_len, tid);
  cp_async_commit();

  const int warp_row0 = warp * 16 * kMTiles;  // the warp's first row in the block
  float o[kMTiles][kD / 8][4];
  float row_max[kMTiles][2], row_sum[kMTiles][2];
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
    for (int dt = 0; dt < kD / 8; ++dt)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[mt][dt][e] = 0.f;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      row_max[mt][half] = -INFINITY;
      row_sum[mt][half] = 0.f;
    }
  }

  cp_async_wait<0>();
  __syncthreads();
  uint32_t qf[kMTiles][kD / 16][4];
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
    for (int ks = 0; ks < kD / 16; ++ks) load_a<kD>(qf[mt][ks], sQ, warp_row0 + mt * 16, ks * 16, lane);

  for (int n = 0; n < n_blocks; ++n) {
    const int n0 = n * kBlockN;
    cp_async_wait<0>();
    __syncthreads();  // K[n] is in shared memory; every warp is done with V[n-1]
    load_tile_async<kBlockN, kD, kThreads>(sV, vm + n0 * v.row_stride, v.row_stride, s.k_len - n0, tid);
    cp_async_commit();

    // S = Q K^T for the warp's rows and the block's kBlockN keys.
    float sc[kMTiles][kBlockN / 8][4];
    fragments_times_rows<T, kD>(sc, qf, sK, lane);

    // Keys past the end, and above the diagonal, score -inf.
    if (n0 + kBlockN > s.k_len || (s.causal && n0 + kBlockN - 1 > m0)) {
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
        for (int nt = 0; nt < kBlockN / 8; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int key = n0 + nt * 8 + 2 * (lane % 4) + (e & 1);
            const int query = m0 + warp_row0 + mt * 16 + lane / 4 + 8 * (e >> 1);
            if (key >= s.k_len || (s.causal && key > query)) sc[mt][nt][e] = -INFINITY;
          }
    }

    // Online softmax: new maxima, rescale what was summed so far, scores -> probabilities.
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        float mx = row_max[mt][half];
#pragma unroll
        for (int nt = 0; nt < kBlockN / 8; ++nt) mx = fmaxf(mx, fmaxf(sc[mt][nt][2 * half], sc[mt][nt][2 * half + 1]));
        mx = quad_max(mx);
        // A row with every key masked so far keeps m = -inf; 0 stands in so no inf - inf is formed.
        const float base = mx == -INFINITY ? 0.f : mx * s.scale_log2;
        const float correction = exp2_fast(row_max[mt][half] * s.scale_log2 - base);
        row_max[mt][half] = mx;
        row_sum[mt][half] *= correction;
#pragma unroll
        for (int dt = 0; dt < kD / 8; ++dt) {
          o[mt][dt][2 * half] *= correction;
          o[mt][dt][2 * half + 1] *= correction;
        }
#pragma unroll
        for (int nt = 0; nt < kBlockN / 8; ++nt)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const float p = exp2_fast(sc[mt][nt][2 * half + e] * s.scale_log2 - base);
            sc[mt][nt][2 * half + e] = p;
            row_sum[mt][half] += p;
          }
      }

    cp_async_wait<0>();
    __syncthreads();  // V[n] is in shared memory; every warp is done with K[n]
    if (n + 1 < n_blocks) {
      load_tile_async<kBlockN, kD, kThreads>(sK, km + (n0 + kBlockN) * k.row_stride, k.row_stride,
                                             s.k_len - n0 - kBlockN, tid);
      cp_async_commit();
    }

    // acc += P V, with P straight from the score registers.
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk) {
      uint32_t pf[kMTiles][4];
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
        pf[mt][0] = pack2<T>(sc[mt][2 * kk][0], sc[mt][2 * kk][1]);
        pf[mt][1] = pack2<T>(sc[mt][2 * kk][2], sc[mt][2 * kk][3]);
        pf[mt][2] = pack2<T>(sc[mt][2 * kk + 1][0], sc[mt][2 * kk + 1][1]);
        pf[mt][3] = pack2<T>(sc[mt][2 * kk + 1][2], sc[mt][2 * kk + 1][3]);
      }
#pragma unroll
      for (int dp = 0; dp < kD / 16; ++dp) {
        uint32_t bf[4];
        load_b_from_cols<kD>(bf, sV, kk * 16, dp * 16, lane);
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
          mma_16816<T>(o[mt][2 * dp], pf[mt], bf[0], bf[1]);
          mma_16816<T>(o[mt][2 * dp + 1], pf[mt], bf[2], bf[3]);
        }
      }
    }
  }

  // O = acc / l into the Q tile (free since Q went to registers), then 16-byte rows to
  // memory; lse = m * scale + log l.
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const float l = quad_sum(row_sum[mt][half]);
      const float inv = l > 0.f ? 1.f / l : 0.f;
      const int local_row = warp_row0 + mt * 16 + lane / 4 + 8 * half, row = m0 + local_row;
#pragma unroll
      for (int dt = 0; dt < kD / 8; ++dt)
        *reinterpret_cast<uint32_t*>(sQ + swizzled<kD>(local_row, dt * 8 + 2 * (lane % 4))) =
            pack2<T>(o[mt][dt][2 * half] * inv, o[mt][dt][2 * half + 1] * inv);
      if (lane % 4 == 0 && row < s.q_len)
        lse[(static_cast<int64_t>(b) * s.heads + h) * s.q_len + row] =
            l > 0.f ? row_max[mt][half] * s.scale + logf(l) : INFINITY;
    }
  __syncthreads();
  store_tile<kBlockM, kD, kThreads>(
      out.matrix(b, h), out.row_stride, m0, s.q_len, sQ, [](int r, int c) { return swizzled<kD>(r, c); }, tid);
}

template <typename T, int kD, int kMTiles>
void launch_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                    const Sizes& s, cudaStream_t stream) {
  using Tile = ForwardTile<kD, kMTiles>;
  const dim3 grid(s.batch * s.heads, ceil_div(s.q_len, Tile::kBlockM));
  launch_with_shared_memory(flash_forward_kernel<T, kD, kMTiles>, grid, kThreads, Tile::kSmemBytes, stream,
                            "flash_attention forward", heads_view<const T>(q), heads_view<const T>(k),
                            heads_view<const T>(v), heads_view<T>(out), static_cast<float*>(lse.raw_data()), s);
}

}  // namespace

void flash_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double scale,
                             const Tensor& out, const Tensor& lse) {
  const char* op = "flash_attention forward";
  const Sizes s = sizes_of(q, k, causal, scale);
  if (s.batch == 0 || s.heads == 0 || s.q_len == 0) return;
  if (flash_attention_forward_sm90_supported(q)) {  // wgmma on Hopper: the same results, faster
    flash_attention_forward_sm90(q, k, v, causal, scale, out, lse);
    return;
  }
  cudaStream_t stream = stream_for(q);
  dispatch_heads(q, op, [&](auto tag, auto head_size) {
    constexpr int kD = decltype(head_size)::value;
    launch_forward<typename decltype(tag)::type, kD, kD == 64 ? 2 : 1>(q, k, v, out, lse, s, stream);
  });
  PRECIS_CUDA_CHECK_LAUNCH(op);
}

}  // namespace precis::ops::cuda
