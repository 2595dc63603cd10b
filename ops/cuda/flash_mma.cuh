// The tensor-core building blocks of the flash-attention kernels (sm_80+), as
// small inline-PTX wrappers a reader can check against the PTX manual:
//
//   mma.sync m16n8k16   C[16x8] += A[16x16] B[16x8], 16-bit inputs, f32 accumulators
//   ldmatrix (x4)       four 8x8 tiles of 16-bit values from shared memory into the
//                       register layout mma wants (.trans: transposed on the way)
//   cp.async (16 B)     global -> shared copies that bypass registers, so the next
//                       tile loads while the tensor cores work on this one
//   bar.sync/arrive     named barriers, so one group of warps can hand a tile to another
//                       without stopping the whole block
//
// Register layouts of m16n8k16 (lane = thread index in the warp, g = lane / 4,
// c = 2 * (lane % 4)):
//   A (row-major 16x16): a0 = A[g][c, c+1]      a1 = A[g+8][c, c+1]
//                        a2 = A[g][c+8, c+9]    a3 = A[g+8][c+8, c+9]
//   B (16x8, "col"):     b0 = B[c, c+1][g]      b1 = B[c+8, c+9][g]
//   C (16x8, f32):       c0, c1 = C[g][c, c+1]  c2, c3 = C[g+8][c, c+1]
// Two adjacent C tiles of a row of scores hold exactly an A tile's values, which
// is how the probabilities P go from one product (S = Q K^T) into the next (P V)
// without leaving registers.
//
// Shared-memory tiles are [rows][cols] of 16-bit values in 16-byte chunks of 8,
// with chunk c of row r stored at chunk c ^ (r % 8) ("XOR swizzle"): the 8 rows an
// ldmatrix reads at one logical chunk then sit in 8 different bank groups, so the
// reads do not conflict.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "ops/cuda/bulk_copy.cuh"     // smem_address
#include "ops/cuda/compute_math.cuh"  // exp2_fast

namespace precis::ops::cuda::flash {

// ---- the matrix instruction

template <typename T>
__device__ __forceinline__ void mma_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    static_assert(std::is_same_v<T, __half>, "flash attention runs on f16 or bf16");
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// Two floats rounded to a pair of 16-bit values in one register (lo in the low half).
template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  } else {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
}

// Unpacks a register of two 16-bit values (pack2's layout) into floats. A bfloat16 is the
// high half of its float: shifts and masks in registers (__bfloat1622float2 on the register's
// address can take a trip through the stack).
template <typename T>
__device__ __forceinline__ float2 unpack2(uint32_t v) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>)
    return make_float2(__uint_as_float(v << 16), __uint_as_float(v & 0xffff0000u));
  else
    return __half22float2(*reinterpret_cast<__half2*>(&v));
}

// ---- shared memory

// Element offset of (row, col) in a swizzled [rows][kCols] tile (col: any column).
template <int kCols>
__device__ __forceinline__ int swizzled(int row, int col) {
  static_assert(kCols % 64 == 0, "tiles are whole 128-byte rows of 8 chunks");
  return row * kCols + ((((col >> 3) ^ (row & 7))) << 3) + (col & 7);
}

template <bool kTrans>
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
  if constexpr (kTrans)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_address(p)));
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_address(p)));
}

// The A fragment of the 16x16 block at (row0, col0) of a row-major [rows][kCols] tile.
template <int kCols, typename T>
__device__ __forceinline__ void load_a(uint32_t (&a)[4], const T* tile, int row0, int col0, int lane) {
  const int row = row0 + (lane & 7) + ((lane >> 3) & 1) * 8, col = col0 + (lane >> 4) * 8;
  ldmatrix_x4<false>(a, tile + swizzled<kCols>(row, col));
}

// The A fragment of the 16x16 block of the TRANSPOSE of a row-major tile: A[m][k] = tile[k0 + k][m0 + m].
template <int kCols, typename T>
__device__ __forceinline__ void load_a_transposed(uint32_t (&a)[4], const T* tile, int k0, int m0, int lane) {
  const int row = k0 + (lane & 7) + (lane >> 4) * 8, col = m0 + ((lane >> 3) & 1) * 8;
  ldmatrix_x4<true>(a, tile + swizzled<kCols>(row, col));
}

// B fragments of two n-tiles (n0 and n0 + 8) for k in [k0, k0 + 16) from a tile stored
// [n][k] (B = tile^T, e.g. K in S = Q K^T): b[0], b[1] for n0; b[2], b[3] for n0 + 8.
template <int kCols, typename T>
__device__ __forceinline__ void load_b_from_rows(uint32_t (&b)[4], const T* tile, int n0, int k0, int lane) {
  const int row = n0 + (lane & 7) + (lane >> 4) * 8, col = k0 + ((lane >> 3) & 1) * 8;
  ldmatrix_x4<false>(b, tile + swizzled<kCols>(row, col));
}

// B fragments of two n-tiles (n0, n0 + 8) for k in [k0, k0 + 16) from a tile stored
// [k][n] (B = tile, e.g. V in O = P V): b[0], b[1] for n0; b[2], b[3] for n0 + 8.
template <int kCols, typename T>
__device__ __forceinline__ void load_b_from_cols(uint32_t (&b)[4], const T* tile, int k0, int n0, int lane) {
  const int row = k0 + (lane & 7) + ((lane >> 3) & 1) * 8, col = n0 + (lane >> 4) * 8;
  ldmatrix_x4<true>(b, tile + swizzled<kCols>(row, col));
}

// out = a x rows^T: a holds kTiles A fragments of 16 rows, kD deep (in registers); rows is a
// [8 * kN8][kD] tile in shared memory (keys, queries or dO rows); out (C fragments, kTiles x
// 8 * kN8) is overwritten. S = Q K^T in the forward; S^T = K Q^T and dP^T = V dO^T backward.
template <typename T, int kD, int kTiles, int kN8>
__device__ __forceinline__ void fragments_times_rows(float (&out)[kTiles][kN8][4],
                                                     const uint32_t (&a)[kTiles][kD / 16][4], const T* rows, int lane) {
#pragma unroll
  for (int t = 0; t < kTiles; ++t)
#pragma unroll
    for (int n = 0; n < kN8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) out[t][n][e] = 0.f;
#pragma unroll
  for (int ks = 0; ks < kD / 16; ++ks)
#pragma unroll
    for (int np = 0; np < kN8 / 2; ++np) {
      uint32_t bf[4];
      load_b_from_rows<kD>(bf, rows, np * 16, ks * 16, lane);
#pragma unroll
      for (int t = 0; t < kTiles; ++t) {
        mma_16816<T>(out[t][2 * np], a[t][ks], bf[0], bf[1]);
        mma_16816<T>(out[t][2 * np + 1], a[t][ks], bf[2], bf[3]);
      }
    }
}

// The output side: rows [row0, row0 + kRows) of a [rows, kCols] matrix (row stride
// `stride` elements; those from `rows` on are not written) from a finished shared tile
// whose element (r, c) is at tile + offset(r, c) (its swizzled or paneled layout); kThreads
// threads, 16 bytes each per step.
template <int kRows, int kCols, int kThreads, typename T, typename Offset>
__device__ __forceinline__ void store_tile(T* matrix, int64_t stride, int row0, int rows, const T* tile, Offset offset,
                                           int tid) {
  constexpr int kChunksPerRow = kCols / 8;
#pragma unroll
  for (int i = 0; i < kRows * kChunksPerRow / kThreads; ++i) {
    const int chunk = tid + i * kThreads, local_row = chunk / kChunksPerRow, col = (chunk % kChunksPerRow) * 8;
    if (row0 + local_row < rows)
      *reinterpret_cast<uint4*>(matrix + (row0 + local_row) * stride + col) =
          *reinterpret_cast<const uint4*>(tile + offset(local_row, col));
  }
}

// Starts copying rows [0, kRows) of a [*, kCols] matrix (row stride `stride` elements,
// rows from `valid_rows` on read as zeros) into a swizzled shared tile; kThreads threads.
template <int kRows, int kCols, int kThreads, typename T>
__device__ __forceinline__ void load_tile_async(T* tile, const T* src, int64_t stride, int valid_rows, int tid) {
  constexpr int kChunksPerRow = kCols / 8, kChunks = kRows * kChunksPerRow;
  static_assert(kChunks % kThreads == 0, "every thread copies the same number of chunks");
#pragma unroll
  for (int i = 0; i < kChunks / kThreads; ++i) {
    const int chunk = tid + i * kThreads, row = chunk / kChunksPerRow, col = (chunk % kChunksPerRow) * 8;
    const bool valid = row < valid_rows;
    cp_async_16(tile + swizzled<kCols>(row, col), valid ? src + row * stride + col : src, valid);
  }
}

// ---- named barriers: some warps wait (sync) for others that only signal (arrive);
// `threads` counts both sides. Barrier 0 is __syncthreads'.

__device__ __forceinline__ void barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// dst[0] += a, dst[1] += b in global memory (8-byte aligned), each addition atomic:
// one vector reduction on sm_90, two scalar ones before.
__device__ __forceinline__ void atomic_add_pair(float* dst, float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  atomicAdd(reinterpret_cast<float2*>(dst), make_float2(a, b));
#else
  atomicAdd(dst, a);
  atomicAdd(dst + 1, b);
#endif
}

// ---- quad reductions: the 4 lanes that hold one row of a C fragment

__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

}  // namespace precis::ops::cuda::flash
