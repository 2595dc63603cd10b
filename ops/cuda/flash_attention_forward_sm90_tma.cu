// Flash attention, forward, on Hopper, with the Q, K and V tiles brought by the copy engine: the
// kernel of flash_attention_forward_sm90.cu (same blocks, same wgmma products, same masks and
// online softmax in the same order, so the same bits of O and lse), with its loads changed.
//
// The math, per (b, h) and block of kBlockM query rows, over key blocks n of kBlockN keys
// (causal blocks above the diagonal skipped):
//   S_n = Q K_n^T;  m = max(m_old, rowmax S_n);  c = scale log2(e);
//   P_n = exp2(S_n c - m c);  r = exp2(m_old c - m c);
//   l = l r + rowsum P_n;  O = O r + P_n V_n;  out = O / l,  lse = m scale + log l.
//
// Why: today's kernel makes every thread issue cp.async for the next tiles and meets all
// threads at a __syncthreads per key block, so each warpgroup waits for the slower one and
// for the last 16-byte load of the block. Here one thread (thread 0) asks the copy engine for
// whole tiles (cp.async.bulk.tensor through a CUtensorMap built on the host, which also
// zero-fills the rows past the end, as cp.async's zero-size copies did), and the warpgroups
// meet no block-wide barrier inside the loop: they wait on mbarriers of a ring of stages.
//
// The ring: kStages stages, each the K and V tiles of one key block. Per stage, three
// mbarriers: k_full and v_full (one arrival, thread 0's arrive.expect_tx with the tile's
// bytes; the copy engine completes them as the bytes land) and empty (one arrival per warp,
// 4 kWarpgroups, given once the warp's wgmmas that read the stage have completed). Block n
// lives in stage n % kStages, and waits there use the parity (n / kStages) % 2.
//   start     thread 0 initialises the barriers, asks for Q and for blocks 0 .. kStages-1.
//   block n   wait k_full[n], v_full[n-1]; issue S_n = Q K_n^T and O += P_{n-1} V_{n-1};
//             wait for S_n; mask; online softmax -> P_n;
//             thread 0: wait empty[n-2] (every warp done with block n-2, which both
//             warpgroups finished one block ago, so this rarely waits), ask for block
//             n + kStages - 2 into its stage;
//             wait for O; O *= rescale factor; each warp arrives on empty[n-1].
// The refill waits for block n-2, not n-1, so that thread 0's warpgroup does not wait for
// the other one to finish the block both are in; blocks arrive kStages - 2 blocks ahead.
//
// Where the wait for O lands: ptxas moves a wgmma wait_group up to the top of its basic block.
// In today's kernel the softmax and the wait for O share a block, so the wait runs before
// the exponentials and they do not overlap P V (cuobjdump -sass: WARPGROUP.DEPBAR.LE gsb0,
// 0x0 above the MUFU.EX2). Here thread 0's refill, a branch with a loop, sits between the
// softmax and that wait, so the wait starts a basic block of its own after the exponentials.
//
// Shapes: as today's kernel, 2 warpgroups (kBlockM = 128) and kBlockN = kD. Head size 64:
// 4 stages of 16 KiB + Q 16 KiB, two blocks per SM. Head size 128: 3 stages of 64 KiB + Q
// 32 KiB (225 KiB), one block per SM.
//
// Tensor maps: Q, K and V each as a 4-d tensor (D, T, H, B) with the tensors' own strides
// (so the packed qkv buffer [B, T, 3, H, D] viewed as three [B, H, T, D] tensors works as
// dense ones), boxes of 64 columns x rows (kBlockM for Q, kBlockN for K and V), 128-byte
// swizzle: box row r's 16-byte chunk c lands at chunk c ^ (r % 8) of a 128-byte row, with
// each box at a 1024-byte boundary: the paneled layout of ops/cuda/flash_wgmma.cuh, one box
// per 64-column panel. A tensor the copy engine cannot describe (an address or stride not a
// multiple of 16 bytes) takes today's kernel.
//
// The code assembles only in the sm_90a pass (-gencode arch=compute_90a,code=sm_90a, set
// for this file in CMakeLists.txt); the other passes compile empty kernels.
#include <cuda.h>

#include <atomic>
#include <cstdlib>
#include <cstring>

#include "core/cuda/dispatch.cuh"
#include "core/cuda/launch.cuh"
#include "ops/cuda/bulk_copy.cuh"
#include "ops/cuda/flash_attention_sm90.h"
#include "ops/cuda/flash_params.cuh"
#include "ops/cuda/flash_softmax_sm90.cuh"
#include "ops/cuda/flash_wgmma.cuh"
#include "ops/cuda/tensor_map.h"

namespace precis::ops::cuda {

using namespace precis::cuda;  // the device toolkit (core/cuda/)

namespace {

using namespace flash;

template <int kD, int kWarpgroups, int kBlockN, int kStages>
struct Sm90TmaTile {
  static constexpr int kThreads = 128 * kWarpgroups, kBlockM = 64 * kWarpgroups;
  static constexpr int kQBytes = kBlockM * kD * 2, kKvBytes = kBlockN * kD * 2;  // one K or V tile
  static constexpr int kBarriers = 3 * kStages + 1;                              // k_full, v_full, empty; Q
  // Room to start the tiles on a 1024-byte boundary, Q, the stages, the barriers.
  static constexpr int kSmemBytes = kSwizzleAtomBytes + kQBytes + 2 * kStages * kKvBytes + 8 * kBarriers;
  static_assert(kStages >= 3, "a refill waits for the block two back");
};

// Asks the copy engine for rows [row0, row0 + kRows) of head (b, h) of `map` into a
// [kRows][kD] paneled tile: one box per 64-column panel; the bytes count against `landed`.
template <int kRows, int kD, typename T>
__device__ __forceinline__ void copy_panels(T* tile, const CUtensorMap& map, int row0, int h, int b, uint64_t* landed) {
#pragma unroll
  for (int panel = 0; panel < kD / kPanelCols; ++panel)
    tensor_copy_4d_to_shared(tile + panel * kRows * kPanelCols, &map, panel * kPanelCols, row0, h, b, landed);
}

template <typename T, int kD, int kWarpgroups, int kBlockN, int kStages, int kMinBlocks>
__global__ void __launch_bounds__(128 * kWarpgroups, kMinBlocks)
    flash_forward_sm90_tma_kernel(const __grid_constant__ CUtensorMap q_map, const __grid_constant__ CUtensorMap k_map,
                                  const __grid_constant__ CUtensorMap v_map, HeadsView<T> out, float* lse, Sizes s) {
  precis::cuda::wait_for_previous_grid();
  if constexpr (kSm90aPass) {
    using Tile = Sm90TmaTile<kD, kWarpgroups, kBlockN, kStages>;
    constexpr int kThreads = Tile::kThreads, kBlockM = Tile::kBlockM, kTileElems = kBlockN * kD;
    extern __shared__ unsigned char smem_raw[];
    T* sQ = reinterpret_cast<T*>((reinterpret_cast<uintptr_t>(smem_raw) + kSwizzleAtomBytes - 1) &
                                 ~uintptr_t(kSwizzleAtomBytes - 1));
    T* sK = sQ + kBlockM * kD;          // kStages tiles of kBlockN * kD
    T* sV = sK + kStages * kTileElems;  // kStages tiles
    uint64_t* k_full = reinterpret_cast<uint64_t*>(sV + kStages * kTileElems);
    uint64_t* v_full = k_full + kStages;
    uint64_t* empty = v_full + kStages;
    uint64_t* q_full = empty + kStages;

    const int tid = threadIdx.x, warpgroup = tid / 128, lane = tid % 32;
    const int wg_row0 = 64 * warpgroup;                                // the warpgroup's first row in the block
    const int thread_row0 = wg_row0 + 16 * (tid / 32 % 4) + lane / 4;  // this thread's rows: +0 and +8
    const int b = blockIdx.x / s.heads, h = blockIdx.x % s.heads;
    const int m0 = (gridDim.y - 1 - blockIdx.y) * kBlockM;  // the longest causal rows start first
    int n_blocks = ceil_div(s.k_len, kBlockN);
    if (s.causal) n_blocks = min(n_blocks, ceil_div(min(m0 + kBlockM, s.q_len), kBlockN));

    // Thread 0 only: K_n and V_n into stage n % kStages.
    auto request_block = [&](int n) {
      const int stage = n % kStages;
      mbarrier_arrive_expect_bytes(&k_full[stage], Tile::kKvBytes);
      copy_panels<kBlockN, kD>(sK + stage * kTileElems, k_map, n * kBlockN, h, b, &k_full[stage]);
      mbarrier_arrive_expect_bytes(&v_full[stage], Tile::kKvBytes);
      copy_panels<kBlockN, kD>(sV + stage * kTileElems, v_map, n * kBlockN, h, b, &v_full[stage]);
    };
    auto parity = [](int n) { return static_cast<uint32_t>(n / kStages % 2); };
    // Scores of key block n that need masking: past the end, or reaching above the diagonal.
    auto mask_if_needed = [&](float(&sc)[kBlockN / 2], int n) {
      const int n0 = n * kBlockN;
      if (n0 + kBlockN > s.k_len || (s.causal && n0 + kBlockN - 1 > m0 + wg_row0))
        mask_scores<kBlockN>(sc, n0, m0 + thread_row0, s, lane);
    };

    if (tid == 0) {
      prefetch_tensor_map(&q_map);
      prefetch_tensor_map(&k_map);
      prefetch_tensor_map(&v_map);
      for (int stage = 0; stage < kStages; ++stage) {
        mbarrier_init(&k_full[stage], 1);
        mbarrier_init(&v_full[stage], 1);
        mbarrier_init(&empty[stage], 4 * kWarpgroups);
      }
      mbarrier_init(q_full, 1);
      fence_mbarrier_init();
      mbarrier_arrive_expect_bytes(q_full, Tile::kQBytes);
      copy_panels<kBlockM, kD>(sQ, q_map, m0, h, b, q_full);
      for (int n = 0; n < min(kStages, n_blocks); ++n) request_block(n);
    }
    __syncthreads();  // the barriers are initialised

    float o[kD / 2];
#pragma unroll
    for (int i = 0; i < kD / 2; ++i) o[i] = 0.f;
    float sc[kBlockN / 2];
    uint32_t p[kBlockN / 16][4];
    float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.f, 0.f}, rescale[2];

    mbarrier_wait(q_full, 0);
    if (n_blocks > 0) {
      mbarrier_wait(&k_full[0], 0);
      wgmma_fence();
      issue_scores<T, kD, kBlockN, kBlockM>(sc, sQ, wg_row0, sK);
      wgmma_commit();
      wgmma_wait<0>();
      fence_registers(sc);
      mask_if_needed(sc, 0);
      online_softmax<kBlockN>(sc, row_max, row_sum, rescale, s.scale_log2);
    }
    for (int n = 1; n < n_blocks; ++n) {
      const int stage = n % kStages, previous = (n - 1) % kStages;
      mbarrier_wait(&k_full[stage], parity(n));
      mbarrier_wait(&v_full[previous], parity(n - 1));

      accumulators_to_a<T, kBlockN>(p, sc);
      fence_registers(o);
      wgmma_fence();
      issue_scores<T, kD, kBlockN, kBlockM>(sc, sQ, wg_row0, sK + stage * kTileElems);
      wgmma_commit();
      issue_values<T, kD, kBlockN>(o, p, sV + previous * kTileElems);
      wgmma_commit();

      wgmma_wait<1>();  // S_n is in; O += P_{n-1} V_{n-1} may still run
      fence_registers(sc);
      mask_if_needed(sc, n);
      online_softmax<kBlockN>(sc, row_max, row_sum, rescale, s.scale_log2);

      // The refill, between the softmax and the wait for O (see the head comment).
      if (tid == 0 && n >= 2 && n + kStages - 2 < n_blocks) {
        mbarrier_wait(&empty[(n - 2) % kStages], parity(n - 2));
        request_block(n + kStages - 2);
      }
      __syncwarp();

      wgmma_wait<0>();
      fence_registers(o);
      if (lane == 0) mbarrier_arrive(&empty[previous]);  // this warp is done with block n-1
#pragma unroll
      for (int j = 0; j < kD / 8; ++j) {
        o[4 * j + 0] *= rescale[0];
        o[4 * j + 1] *= rescale[0];
        o[4 * j + 2] *= rescale[1];
        o[4 * j + 3] *= rescale[1];
      }
    }
    if (n_blocks > 0) {
      mbarrier_wait(&v_full[(n_blocks - 1) % kStages], parity(n_blocks - 1));
      accumulators_to_a<T, kBlockN>(p, sc);
      fence_registers(o);
      wgmma_fence();
      issue_values<T, kD, kBlockN>(o, p, sV + ((n_blocks - 1) % kStages) * kTileElems);
      wgmma_commit();
      wgmma_wait<0>();
      fence_registers(o);
    }

    // O = acc / l into this warpgroup's own rows of the Q tile (its score products, their only
    // readers, are done), then 16-byte rows to memory; lse = m * scale + log l.
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const float l = quad_sum(row_sum[half]);
      const float inv = l > 0.f ? 1.f / l : 0.f;
      const int local_row = thread_row0 + 8 * half, row = m0 + local_row;
#pragma unroll
      for (int j = 0; j < kD / 8; ++j)
        *reinterpret_cast<uint32_t*>(sQ + panel_offset<kBlockM>(local_row, 8 * j + 2 * (lane % 4))) =
            pack2<T>(o[4 * j + 2 * half] * inv, o[4 * j + 2 * half + 1] * inv);
      if (lane % 4 == 0 && row < s.q_len)
        lse[(static_cast<int64_t>(b) * s.heads + h) * s.q_len + row] =
            l > 0.f ? row_max[half] * s.scale + logf(l) : INFINITY;
    }
    __syncthreads();
    store_tile<kBlockM, kD, kThreads>(
        out.matrix(b, h), out.row_stride, m0, s.q_len, sQ, [](int r, int c) { return panel_offset<kBlockM>(r, c); },
        tid);
  }
}

// The map of a [B, H, T, D] f16/bf16 tensor with boxes of [box_rows][64]; false where the
// copy engine cannot describe it.
bool heads_tensor_map(CUtensorMap& map, const Tensor& t, int box_rows) {
  const uint64_t sizes[4] = {static_cast<uint64_t>(t.size(3)), static_cast<uint64_t>(t.size(2)),
                             static_cast<uint64_t>(t.size(1)), static_cast<uint64_t>(t.size(0))};
  const int64_t element = 2;
  for (int i = 0; i < 3; ++i)
    if (t.strides()[i] < 0) return false;
  const uint64_t byte_strides[3] = {static_cast<uint64_t>(t.strides()[2] * element),
                                    static_cast<uint64_t>(t.strides()[1] * element),
                                    static_cast<uint64_t>(t.strides()[0] * element)};
  const uint32_t box[4] = {static_cast<uint32_t>(kPanelCols), static_cast<uint32_t>(box_rows), 1, 1};
  const CUtensorMapDataType type =
      t.dtype() == DType::bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  return encode_tiled_tensor_map(map, type, t.raw_data(), 4, sizes, byte_strides, box, CU_TENSOR_MAP_SWIZZLE_128B);
}

template <typename T, int kD, int kWarpgroups, int kBlockN, int kStages, int kMinBlocks>
bool launch_forward_sm90_tma(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                             const Sizes& s, cudaStream_t stream) {
  using Tile = Sm90TmaTile<kD, kWarpgroups, kBlockN, kStages>;
  auto* kernel = flash_forward_sm90_tma_kernel<T, kD, kWarpgroups, kBlockN, kStages, kMinBlocks>;
  // Head size 128 takes nearly all of a block's 227 KiB: check that the device lets it
  // (decided once per process, for the device current at the first call).
  static const bool fits = [&] {
    const char* op = "flash_attention forward (sm_90a, tensor copies)";
    int device = 0, limit = 0;
    PRECIS_CUDA_CHECK(cudaGetDevice(&device), op);
    PRECIS_CUDA_CHECK(cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device), op);
    cudaFuncAttributes attributes{};
    PRECIS_CUDA_CHECK(cudaFuncGetAttributes(&attributes, kernel), op);
    return attributes.sharedSizeBytes + Tile::kSmemBytes <= static_cast<size_t>(limit);
  }();
  CUtensorMap q_map, k_map, v_map;
  if (!fits || !heads_tensor_map(q_map, q, Tile::kBlockM) || !heads_tensor_map(k_map, k, kBlockN) ||
      !heads_tensor_map(v_map, v, kBlockN))
    return false;
  const dim3 grid(s.batch * s.heads, ceil_div(s.q_len, Tile::kBlockM));
  launch_with_shared_memory(kernel, grid, Tile::kThreads, Tile::kSmemBytes, stream,
                            "flash_attention forward (sm_90a, tensor copies)", q_map, k_map, v_map, heads_view<T>(out),
                            static_cast<float*>(lse.raw_data()), s);
  return true;
}

// PRECIS_AB_OLD_FLASH_FWD=1 (read once) or set_flash_forward_sm90_tensor_copy(false) keep the
// cp.async kernel.
std::atomic<int> g_tensor_copy_setting{-1};  // -1: not decided yet, 0 off, 1 on

}  // namespace

void set_flash_forward_sm90_tensor_copy(bool on) { g_tensor_copy_setting.store(on ? 1 : 0); }

bool flash_forward_sm90_tensor_copy() {
  int setting = g_tensor_copy_setting.load();
  if (setting < 0) {
    const char* old = std::getenv("PRECIS_AB_OLD_FLASH_FWD");
    const int from_env = old != nullptr && std::strcmp(old, "1") == 0 ? 0 : 1;
    g_tensor_copy_setting.compare_exchange_strong(setting, from_env);  // a setter call that came first wins
    setting = g_tensor_copy_setting.load();
  }
  return setting == 1;
}

bool flash_attention_forward_sm90_tensor_copy(const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                                              double scale, const Tensor& out, const Tensor& lse) {
  const char* op = "flash_attention forward (sm_90a, tensor copies)";
  PRECIS_CHECK(flash_attention_forward_sm90_supported(q), op, ": needs a compute-capability 9.0 GPU, f16 or bf16, ",
               "head size 64 or 128");
  const Sizes s = sizes_of(q, k, causal, scale);
  if (s.batch == 0 || s.heads == 0 || s.q_len == 0 || s.k_len == 0) return false;
  cudaStream_t stream = stream_for(q);
  bool launched = false;
  dispatch_heads(q, op, [&](auto tag, auto head_size) {
    constexpr int kD = decltype(head_size)::value;  // key blocks of kD keys; 2 blocks per SM at 64
    using T = typename decltype(tag)::type;
    if constexpr (kD == 64)
      launched = launch_forward_sm90_tma<T, kD, 2, kD, 4, 2>(q, k, v, out, lse, s, stream);
    else
      launched = launch_forward_sm90_tma<T, kD, 2, kD, 3, 1>(q, k, v, out, lse, s, stream);
  });
  if (launched) PRECIS_CUDA_CHECK_LAUNCH(op);
  return launched;
}

}  // namespace precis::ops::cuda
