// Online softmax statistics (Milakov & Gimelshein): the pair (m, s) of a set of values,
// m their maximum and s the sum of exp(x - m), folded in one value at a time and merged
// between threads, so a row's log-sum-exp, m + log s, takes one pass over it:
//   adding x:    m' = max(m, x),  s' = s exp(m - m') + exp(x - m')
//   merging two: m = max(m1, m2), s = s1 exp(m1 - m) + s2 exp(m2 - m)
// Used by the softmax and cross-entropy kernels, in the compute type A.
#pragma once

#include <limits>

#include "core/cuda/block_reduce.cuh"

namespace precis::ops::cuda {

// Folds x in. A -inf adds exp(-inf) = 0 and is skipped, so that -inf - -inf (NaN) is never formed.
template <typename A>
__device__ __forceinline__ void max_sum_add(precis::cuda::Pair<A>& ms, A x) {
  if (x > ms.first) {
    ms.second = ms.second * ::exp(ms.first - x) + A(1);
    ms.first = x;
  } else if (x != -std::numeric_limits<A>::infinity()) {
    ms.second += ::exp(x - ms.first);
  }
}

struct MaxSumOp {
  template <typename A>
  __device__ __forceinline__ precis::cuda::Pair<A> operator()(precis::cuda::Pair<A> a, precis::cuda::Pair<A> b) const {
    const A m = a.first > b.first ? a.first : b.first;
    if (m == -std::numeric_limits<A>::infinity()) return {m, A(0)};
    return {m, a.second * ::exp(a.first - m) + b.second * ::exp(b.first - m)};
  }
};

template <typename A>
__device__ __forceinline__ precis::cuda::Pair<A> max_sum_identity() {
  return {-std::numeric_limits<A>::infinity(), A(0)};
}

}  // namespace precis::ops::cuda
