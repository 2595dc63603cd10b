// The Hopper (sm_90a) tensor-core building blocks of the flash-attention forward and backward
// (ops/cuda/flash_attention_*_sm90.cu), as inline-PTX wrappers a reader can check against the
// PTX manual ("Asynchronous Warpgroup Level Matrix Multiply-Accumulate"):
//
//   wgmma.mma_async m64nNk16   D[64xN] (+)= A[64x16] B[16xN], issued by one warpgroup
//                              (4 consecutive warps, 128 threads), f16/bf16 inputs, f32
//                              accumulators in registers; B always from shared memory
//                              through a descriptor, A from shared memory or registers.
//                              Asynchronous: the registers and tiles it touches belong to
//                              the tensor cores until a wait_group says it is done.
//   wgmma.fence                before the first wgmma that reads registers written since
//   wgmma.commit_group         closes a group of issued wgmmas
//   wgmma.wait_group N         waits until at most N groups are still running
//   fence.proxy.async          orders this thread's ordinary shared-memory writes (cp.async
//                              included) before the tensor cores' reads of them
//
// Register layouts (per warpgroup; warp w = (thread / 32) % 4 holds rows 16w..16w+15,
// g = lane / 4, c = 2 * (lane % 4)), the same as mma.sync m16n8k16's per warp:
//   D (64xN f32, N/2 floats):  d[4j + 0, 1] = D[16w + g][8j + c, c+1]
//                              d[4j + 2, 3] = D[16w + g + 8][8j + c, c+1]      (j < N/8)
//   A (64x16, 4 registers of 2 values): a[0] = A[16w + g][c, c+1]      a[1] = A[16w + g + 8][c, c+1]
//                                       a[2] = A[16w + g][c+8, c+9]    a[3] = A[16w + g + 8][c+8, c+9]
// So the 8 accumulators d[8i .. 8i+7] of a score product are exactly the A registers of
// keys 16i..16i+15 once rounded to 16 bits in pairs: the probabilities P go from
// S = Q K^T into O += P V without leaving registers (accumulators_to_a below).
//
// Shared-memory tiles: a [rows][kD] tile of 16-bit values is kept as kD/64 panels of
// [rows][64] (one 128-byte row per panel row), and in each panel the 16-byte chunk c of
// row r sits at chunk c ^ (r % 8). With every panel starting on a 1024-byte boundary this
// is the wgmma "128-byte swizzle" canonical layout, read through a descriptor:
//   K-major operand (A = Q rows, B = K rows: the product's k runs along a row):
//     8-row groups 1024 bytes apart (stride byte offset); the 16 columns of k-step ks
//     start ks % 4 * 32 bytes into a row of panel ks / 4 (the hardware applies the XOR to
//     the computed address, so a start 32 bytes in reads the swizzled chunks right).
//   MN-major operand (B = V rows [keys][d]: the product's k runs down the rows, n along
//     them; the transpose bit): 16 keys per k-step, 2048 bytes; 8-row groups 1024 bytes
//     apart (stride byte offset); 64-column panels `rows * 128` bytes apart (leading byte offset).
//   MN-major A (the transpose bit of A, 16-bit types only): the same layout, the product's
//     m along the rows; the backward reads its dS^T tile [keys][queries] so for dQ = dS K.
// All three are checked element by element against CPU products in
// tests/ops/test_flash_wgmma_gpu.cpp (through tests/ops/flash_wgmma_probe.cu).
//
// The instructions assemble only for sm_90a: call these only from code compiled in the
// sm_90a pass (__CUDA_ARCH_FEAT_SM90_ALL; the kernels that use them compile empty elsewhere).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "ops/cuda/flash_mma.cuh"

namespace precis::ops::cuda::flash {

// Whether this compilation pass assembles wgmma: the sm_90a device pass (and the host pass,
// so that host code sees the kernels' real shapes); the sm_80 and sm_90 passes compile the
// kernels' bodies out.
#if defined(__CUDA_ARCH_FEAT_SM90_ALL) || !defined(__CUDA_ARCH__)
inline constexpr bool kSm90aPass = true;
#else
inline constexpr bool kSm90aPass = false;
#endif

// ---- shared-memory tiles

inline constexpr int kPanelCols = 64;           // 16-bit values per 128-byte panel row
inline constexpr int kSwizzleAtomBytes = 1024;  // 8 rows of 128 bytes: where every panel starts

// Element offset of (row, col) in a [kRows][kD] tile kept as kD/64 swizzled panels.
template <int kRows>
__host__ __device__ __forceinline__ int panel_offset(int row, int col) {
  static_assert(kRows % 8 == 0, "panels are whole 1024-byte swizzle atoms");
  return (col / kPanelCols) * kRows * kPanelCols + row * kPanelCols + ((((col % kPanelCols) >> 3) ^ (row & 7)) << 3) +
         (col & 7);
}

// Starts copying rows [0, kRows) of a [*, kD] matrix (row stride `stride` elements, rows
// from `valid_rows` on read as zeros) into a paneled tile; kThreads threads, thread `tid`.
template <int kRows, int kD, int kThreads, typename T>
__device__ __forceinline__ void load_panels_async(T* tile, const T* src, int64_t stride, int valid_rows, int tid) {
  constexpr int kChunksPerRow = kD / 8, kChunks = kRows * kChunksPerRow;
#pragma unroll
  for (int i = 0; i < (kChunks + kThreads - 1) / kThreads; ++i) {
    const int chunk = tid + i * kThreads, row = chunk / kChunksPerRow, col = (chunk % kChunksPerRow) * 8;
    if (kChunks % kThreads == 0 || chunk < kChunks) {
      const bool valid = row < valid_rows;
      cp_async_16(tile + panel_offset<kRows>(row, col), valid ? src + row * stride + col : src, valid);
    }
  }
}

// ---- descriptors

// A 128-byte-swizzle matrix descriptor: start address, leading and stride byte offsets (all
// in 16-byte units, 14 bits each: shared addresses stay below 256 KiB), base offset 0 (every
// panel starts on a 1024-byte boundary), swizzle mode 1 in bits 62-63.
__device__ __forceinline__ uint64_t swizzle128_descriptor(uint32_t smem_byte_address, uint32_t leading_bytes,
                                                          uint32_t stride_bytes) {
  return static_cast<uint64_t>((smem_byte_address & 0x3FFFF) >> 4) | static_cast<uint64_t>(leading_bytes >> 4) << 16 |
         static_cast<uint64_t>(stride_bytes >> 4) << 32 | 1ull << 62;
}

// The descriptor of k-step ks (columns 16ks..16ks+15) of rows [row0, row0 + 64 or N) of a
// K-major [kRows][kD] paneled tile. The leading byte offset is unused by swizzled K-major
// layouts ("assumed 1").
template <int kRows>
__device__ __forceinline__ uint64_t k_major_descriptor(const void* tile, int row0, int ks) {
  const uint32_t address = smem_address(tile) + (ks * 16 / kPanelCols) * kRows * 128 + row0 * 128 + (ks % 4) * 32;
  return swizzle128_descriptor(address, 16, kSwizzleAtomBytes);
}

// The descriptor of k-step kk (rows 16kk..16kk+15, columns from col0, a multiple of 8) of
// an MN-major [kRows][kD] paneled tile. A start inside a panel row works as the K-major
// k-steps do: the hardware swizzles the address it computes.
template <int kRows>
__device__ __forceinline__ uint64_t mn_major_descriptor(const void* tile, int kk, int col0 = 0) {
  const uint32_t address =
      smem_address(tile) + (col0 / kPanelCols) * kRows * 128 + kk * 16 * 128 + (col0 % kPanelCols) * 2;
  return swizzle128_descriptor(address, kRows * 128, kSwizzleAtomBytes);
}

// ---- the instructions

// Operand lists of the wgmma wrappers: N/2 accumulators "+f", 16 at a time.
#define PRECIS_WGMMA_ACC16(d, o)                                                                                    \
  "+f"(d[(o) + 0]), "+f"(d[(o) + 1]), "+f"(d[(o) + 2]), "+f"(d[(o) + 3]), "+f"(d[(o) + 4]), "+f"(d[(o) + 5]),       \
      "+f"(d[(o) + 6]), "+f"(d[(o) + 7]), "+f"(d[(o) + 8]), "+f"(d[(o) + 9]), "+f"(d[(o) + 10]), "+f"(d[(o) + 11]), \
      "+f"(d[(o) + 12]), "+f"(d[(o) + 13]), "+f"(d[(o) + 14]), "+f"(d[(o) + 15])
#define PRECIS_WGMMA_D16 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}"
#define PRECIS_WGMMA_D32                                                                                       \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, " \
  "%23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define PRECIS_WGMMA_D64                                                                                       \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, " \
  "%23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, "  \
  "%44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"

// A and B from shared memory, both K-major: "p, 1, 1, 0, 0" = accumulate when p, A and B
// not negated, neither transposed.
#define PRECIS_WGMMA_SS_N64(type)                                                      \
  asm volatile(                                                                        \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"                                     \
      "wgmma.mma_async.sync.aligned.m64n64k16.f32." type "." type " " PRECIS_WGMMA_D32 \
      ", %32, %33, p, 1, 1, 0, 0;\n}\n"                                                \
      : PRECIS_WGMMA_ACC16(d, 0), PRECIS_WGMMA_ACC16(d, 16)                            \
      : "l"(a_desc), "l"(b_desc), "r"(accumulate))
#define PRECIS_WGMMA_SS_N128(type)                                                                                \
  asm volatile(                                                                                                   \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"                                                                \
      "wgmma.mma_async.sync.aligned.m64n128k16.f32." type "." type " " PRECIS_WGMMA_D64                           \
      ", %64, %65, p, 1, 1, 0, 0;\n}\n"                                                                           \
      : PRECIS_WGMMA_ACC16(d, 0), PRECIS_WGMMA_ACC16(d, 16), PRECIS_WGMMA_ACC16(d, 32), PRECIS_WGMMA_ACC16(d, 48) \
      : "l"(a_desc), "l"(b_desc), "r"(accumulate))
// A and B from shared memory, both MN-major: "p, 1, 1, 1, 1" = accumulate when p, A and B
// not negated, both transposed (16-bit types only).
#define PRECIS_WGMMA_SS_TRANSPOSED_N32(type)                                           \
  asm volatile(                                                                        \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"                                     \
      "wgmma.mma_async.sync.aligned.m64n32k16.f32." type "." type " " PRECIS_WGMMA_D16 \
      ", %16, %17, p, 1, 1, 1, 1;\n}\n"                                                \
      : PRECIS_WGMMA_ACC16(d, 0)                                                       \
      : "l"(a_desc), "l"(b_desc), "r"(accumulate))
// A from registers, B from shared memory MN-major: "p, 1, 1, 1" = accumulate when p, A and
// B not negated, B transposed.
#define PRECIS_WGMMA_RS_N64(type)                                                      \
  asm volatile(                                                                        \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"                                     \
      "wgmma.mma_async.sync.aligned.m64n64k16.f32." type "." type " " PRECIS_WGMMA_D32 \
      ", {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"                                  \
      : PRECIS_WGMMA_ACC16(d, 0), PRECIS_WGMMA_ACC16(d, 16)                            \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(accumulate))
#define PRECIS_WGMMA_RS_N128(type)                                                                                \
  asm volatile(                                                                                                   \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"                                                                \
      "wgmma.mma_async.sync.aligned.m64n128k16.f32." type "." type " " PRECIS_WGMMA_D64                           \
      ", {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"                                                             \
      : PRECIS_WGMMA_ACC16(d, 0), PRECIS_WGMMA_ACC16(d, 16), PRECIS_WGMMA_ACC16(d, 32), PRECIS_WGMMA_ACC16(d, 48) \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(accumulate))

// d (+)= A B, A and B from shared memory (K-major descriptors); accumulate = 0 overwrites d.
template <typename T, int N>
__device__ __forceinline__ void wgmma_smem_smem(float (&d)[N / 2], uint64_t a_desc, uint64_t b_desc, int accumulate) {
  static_assert(N == 64 || N == 128, "wrapped shapes: m64n64k16, m64n128k16");
  constexpr bool kBf16 = std::is_same_v<T, __nv_bfloat16>;
  static_assert(kBf16 || std::is_same_v<T, __half>, "f16 or bf16");
  if constexpr (N == 64) {
    if constexpr (kBf16)
      PRECIS_WGMMA_SS_N64("bf16");
    else
      PRECIS_WGMMA_SS_N64("f16");
  } else {
    if constexpr (kBf16)
      PRECIS_WGMMA_SS_N128("bf16");
    else
      PRECIS_WGMMA_SS_N128("f16");
  }
}

// d (+)= A B, A from registers (the layout above), B from shared memory (MN-major descriptor).
template <typename T, int N>
__device__ __forceinline__ void wgmma_regs_smem(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t b_desc,
                                                int accumulate) {
  static_assert(N == 64 || N == 128, "wrapped shapes: m64n64k16, m64n128k16");
  constexpr bool kBf16 = std::is_same_v<T, __nv_bfloat16>;
  static_assert(kBf16 || std::is_same_v<T, __half>, "f16 or bf16");
  if constexpr (N == 64) {
    if constexpr (kBf16)
      PRECIS_WGMMA_RS_N64("bf16");
    else
      PRECIS_WGMMA_RS_N64("f16");
  } else {
    if constexpr (kBf16)
      PRECIS_WGMMA_RS_N128("bf16");
    else
      PRECIS_WGMMA_RS_N128("f16");
  }
}

// d (+)= A B, A and B from shared memory, both MN-major (descriptors of tiles whose rows run
// along the product's k): A = the transpose of a [k][m] tile, B = a [k][n] tile.
template <typename T, int N>
__device__ __forceinline__ void wgmma_smem_smem_transposed(float (&d)[N / 2], uint64_t a_desc, uint64_t b_desc,
                                                           int accumulate) {
  static_assert(N == 32, "wrapped shape: m64n32k16");
  constexpr bool kBf16 = std::is_same_v<T, __nv_bfloat16>;
  static_assert(kBf16 || std::is_same_v<T, __half>, "f16 or bf16");
  if constexpr (kBf16)
    PRECIS_WGMMA_SS_TRANSPOSED_N32("bf16");
  else
    PRECIS_WGMMA_SS_TRANSPOSED_N32("f16");
}

#undef PRECIS_WGMMA_SS_TRANSPOSED_N32
#undef PRECIS_WGMMA_SS_N64
#undef PRECIS_WGMMA_SS_N128
#undef PRECIS_WGMMA_RS_N64
#undef PRECIS_WGMMA_RS_N128
#undef PRECIS_WGMMA_D16
#undef PRECIS_WGMMA_D32
#undef PRECIS_WGMMA_D64
#undef PRECIS_WGMMA_ACC16

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}

// Tells the compiler that the tensor cores own `r` here: no read of it moves above a
// wait_group placed before this, and no write below a wgmma placed after it.
template <int kN>
__device__ __forceinline__ void fence_registers(float (&r)[kN]) {
#pragma unroll
  for (int i = 0; i < kN; ++i) asm volatile("" : "+f"(r[i])::"memory");
}

// This thread's earlier shared-memory writes (cp.async included, after its wait) become
// visible to the tensor cores' reads that a later barrier orders after them.
__device__ __forceinline__ void fence_shared_for_tensor_cores() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// ---- the two products of the forward

// s = Q_rows K^T: Q rows [q_row0, q_row0 + 64) of a [kQRows][kD] paneled tile times the
// kN keys of a [kN][kD] paneled tile; s (64 x kN accumulators) is overwritten. Issues
// kD/16 wgmmas; the caller fences, commits and waits.
template <typename T, int kD, int kN, int kQRows>
__device__ __forceinline__ void issue_scores(float (&s)[kN / 2], const T* q_tile, int q_row0, const T* k_tile) {
#pragma unroll
  for (int ks = 0; ks < kD / 16; ++ks)
    wgmma_smem_smem<T, kN>(s, k_major_descriptor<kQRows>(q_tile, q_row0, ks), k_major_descriptor<kN>(k_tile, 0, ks),
                           ks > 0);
}

// o += P V: P as A registers (kKeys/16 k-steps of 4 registers), V a [kKeys][kD] paneled
// tile read MN-major. Issues kKeys/16 wgmmas; the caller fences, commits and waits.
template <typename T, int kD, int kKeys>
__device__ __forceinline__ void issue_values(float (&o)[kD / 2], const uint32_t (&p)[kKeys / 16][4], const T* v_tile) {
#pragma unroll
  for (int kk = 0; kk < kKeys / 16; ++kk) wgmma_regs_smem<T, kD>(o, p[kk], mn_major_descriptor<kKeys>(v_tile, kk), 1);
}

// The A registers of P from the f32 accumulators of S (the layouts above): pairs rounded to T.
template <typename T, int kN>
__device__ __forceinline__ void accumulators_to_a(uint32_t (&p)[kN / 16][4], const float (&s)[kN / 2]) {
#pragma unroll
  for (int kk = 0; kk < kN / 16; ++kk)
#pragma unroll
    for (int r = 0; r < 4; ++r) p[kk][r] = pack2<T>(s[8 * kk + 2 * r], s[8 * kk + 2 * r + 1]);
}

// ---- what the backward adds (ops/cuda/flash_attention_backward_sm90.cu)

// Writes A registers (accumulators_to_a's layout) of a 64 x kN product into rows
// [row0, row0 + 64) of a [kRows][kN] paneled tile; thread `tid` of the warpgroup.
// Conflict-free: the 8 rows a warp writes at once sit in 8 different 16-byte chunks.
template <typename T, int kRows, int kN>
__device__ __forceinline__ void store_a_to_panels(T* tile, int row0, const uint32_t (&a)[kN / 16][4], int tid) {
  const int lane = tid % 32, row = row0 + 16 * (tid / 32 % 4) + lane / 4;
#pragma unroll
  for (int kk = 0; kk < kN / 16; ++kk)
#pragma unroll
    for (int r = 0; r < 4; ++r)
      *reinterpret_cast<uint32_t*>(
          tile + panel_offset<kRows>(row + 8 * (r % 2), 16 * kk + 8 * (r / 2) + 2 * (lane % 4))) = a[kk][r];
}

// d = A^T B over kK rows: A^T of a [kK][64] paneled tile (its 64 columns are the product's
// rows), B columns [col0, col0 + kN) of a [kK][*] paneled tile; d (64 x kN accumulators) is
// overwritten. dQ = dS K in the backward, with dS^T stored [keys][queries]. Issues kK/16
// wgmmas; the caller fences, commits and waits.
template <typename T, int kK, int kN>
__device__ __forceinline__ void issue_transposed_product(float (&d)[kN / 2], const T* a_tile, const T* b_tile,
                                                         int col0) {
#pragma unroll
  for (int kk = 0; kk < kK / 16; ++kk)
    wgmma_smem_smem_transposed<T, kN>(d, mn_major_descriptor<kK>(a_tile, kk), mn_major_descriptor<kK>(b_tile, kk, col0),
                                      kk > 0);
}

// ---- bulk reductions into global memory (the TMA unit; one thread issues, for all)

// Adds `bytes` (a multiple of 16) of f32 values at src (shared memory, 16-byte aligned) into
// dst (global memory, 16-byte aligned) element by element, asynchronously, in the current
// bulk group. The writes to src that it must see need fence_shared_for_tensor_cores (the
// async proxy reads them) and a barrier before it.
__device__ __forceinline__ void bulk_reduce_add_f32(float* dst, const float* src, uint32_t bytes) {
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(dst),
               "r"(smem_address(src)), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
// Waits until at most kPending of this thread's bulk groups still read their shared memory
// (their additions complete by the end of the grid).
template <int kPending>
__device__ __forceinline__ void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(kPending) : "memory");
}

}  // namespace precis::ops::cuda::flash
