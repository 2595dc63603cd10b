// The score masking and online softmax of the Hopper flash-attention forwards
// (ops/cuda/flash_attention_forward_sm90.cu and its tensor-copy variant
// ops/cuda/flash_attention_forward_sm90_tma.cu), on one thread's share of a 64 x kBlockN
// score accumulator of a warpgroup (the D layout in ops/cuda/flash_wgmma.cuh: two rows,
// g and g + 8, kBlockN / 4 columns each). Both kernels call these same functions in the same
// order, so they give the same bits.
#pragma once

#include <cmath>

#include "ops/cuda/flash_mma.cuh"
#include "ops/cuda/flash_params.cuh"

namespace precis::ops::cuda::flash {

// Scores of keys past the end, and above the diagonal, become -inf. query0: this thread's
// first row (its second is query0 + 8); key0: the block's first key.
template <int kBlockN>
__device__ __forceinline__ void mask_scores(float (&s)[kBlockN / 2], int key0, int query0, const Sizes& sz, int lane) {
#pragma unroll
  for (int j = 0; j < kBlockN / 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int key = key0 + 8 * j + 2 * (lane % 4) + (e & 1), query = query0 + 8 * (e >> 1);
      if (key >= sz.k_len || (sz.causal && key > query)) s[4 * j + e] = -INFINITY;
    }
}

// Online softmax of one key block for this thread's two rows: new maxima, the factor that
// rescales what was summed so far (into `rescale`), scores -> probabilities (in place),
// partial row sums (this thread's columns; the quad's sum is taken at the end).
template <int kBlockN>
__device__ __forceinline__ void online_softmax(float (&s)[kBlockN / 2], float (&row_max)[2], float (&row_sum)[2],
                                               float (&rescale)[2], float scale_log2) {
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    float mx = row_max[half];
#pragma unroll
    for (int j = 0; j < kBlockN / 8; ++j) mx = fmaxf(mx, fmaxf(s[4 * j + 2 * half], s[4 * j + 2 * half + 1]));
    mx = quad_max(mx);
    // A row with every key masked so far keeps m = -inf; 0 stands in so no inf - inf is formed.
    const float base = mx == -INFINITY ? 0.f : mx * scale_log2;
    rescale[half] = exp2_fast(row_max[half] * scale_log2 - base);
    row_max[half] = mx;
    float sum = 0.f;
#pragma unroll
    for (int j = 0; j < kBlockN / 8; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float p = exp2_fast(s[4 * j + 2 * half + e] * scale_log2 - base);
        s[4 * j + 2 * half + e] = p;
        sum += p;
      }
    row_sum[half] = row_sum[half] * rescale[half] + sum;
  }
}

}  // namespace precis::ops::cuda::flash
