// Row kernels (softmax, layer norm, cross entropy): the threads that share one row of n
// values are a warp for short rows (several rows to a block, no shared memory, no barrier
// in the reductions) and a whole block for long ones. kThreads is the row group's size.
#pragma once

#include <cstdint>
#include <type_traits>

#include "core/cuda/block_reduce.cuh"

namespace precis::ops::cuda {

// Reduces over the kThreads threads of a row group: a warp (kThreads 32, no shared
// memory, no barrier) or a whole block of kThreads (see dispatch_row_threads).
template <int kThreads, typename V, typename Op>
__device__ __forceinline__ V row_all_reduce(V v, Op op) {
  if constexpr (kThreads == 32)
    return precis::cuda::warp_all_reduce(v, op);
  else
    return precis::cuda::block_all_reduce(v, op);
}

// Calls fn(std::integral_constant<int, kThreads>) with the threads that share one row of n values.
template <typename Fn>
void dispatch_row_threads(int64_t n, Fn&& fn) {
  if (n <= 1024) return fn(std::integral_constant<int, 32>{});
  if (n <= 16384) return fn(std::integral_constant<int, 256>{});
  return fn(std::integral_constant<int, 512>{});
}

// Block shape and grid for `rows` rows with kThreads threads per row: warps are stacked
// kWarpRowsPerBlock to a block (threadIdx.y picks the row), blocks take one row each.
inline constexpr int kWarpRowsPerBlock = 8;
template <int kThreads>
inline constexpr int kRowBlockThreads = kThreads == 32 ? 32 * kWarpRowsPerBlock : kThreads;
// __launch_bounds__ of a row kernel: at least 1024 threads resident per SM (at most 64 registers each).
#define PRECIS_ROW_LAUNCH_BOUNDS(kThreads) \
  __launch_bounds__(kRowBlockThreads<kThreads>, 1024 / kRowBlockThreads<kThreads>)
template <int kThreads>
dim3 row_block() {
  return kThreads == 32 ? dim3(32, kWarpRowsPerBlock) : dim3(kThreads, 1);
}
template <int kThreads>
unsigned row_grid(int64_t rows) {
  const int64_t per_block = kThreads == 32 ? kWarpRowsPerBlock : 1;
  return static_cast<unsigned>((rows + per_block - 1) / per_block);
}
__device__ __forceinline__ int64_t row_index() { return static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y; }

}  // namespace precis::ops::cuda
