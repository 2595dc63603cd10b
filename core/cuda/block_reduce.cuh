// Warp and block reductions with a fixed order: the shuffle pattern and the order in
// which partial results are combined depend only on the block shape, so a result is the
// same from run to run (no atomics).
//
// Two forms, because their orders differ and each kernel keeps the one it was validated
// with:
//   all-reduce (warp_all_reduce, block_all_reduce): a butterfly of __shfl_xor_sync, every
//     thread ends with the result; for row statistics every thread then uses.
//   reduce to one thread (group_reduce, block_reduce): a tree of __shfl_down_sync, lane 0
//     (thread 0) ends with the result; for the Reducer interface of ops/cuda/reduce.cuh,
//     whose combine may be any associative operation on any trivially copyable value.
#pragma once

#include <cstdint>
#include <cstring>

namespace precis::cuda {

template <typename A>
struct Pair {
  A first, second;
};

template <typename A>
__device__ __forceinline__ A shuffle_xor(A v, int mask) {
  return __shfl_xor_sync(0xffffffffu, v, mask);
}
template <typename A>
__device__ __forceinline__ Pair<A> shuffle_xor(Pair<A> v, int mask) {
  return {__shfl_xor_sync(0xffffffffu, v.first, mask), __shfl_xor_sync(0xffffffffu, v.second, mask)};
}

template <typename V, typename Op>
__device__ __forceinline__ V warp_all_reduce(V v, Op op) {
#pragma unroll
  for (int mask = 16; mask > 0; mask >>= 1) v = op(v, shuffle_xor(v, mask));
  return v;
}

// Reduces over a one-dimensional block of any multiple of 32 threads (at most 1024);
// every thread must call it.
template <typename V, typename Op>
__device__ __forceinline__ V block_all_reduce(V v, Op op) {
  __shared__ V partial[32];
  v = warp_all_reduce(v, op);
  const int warps = blockDim.x / 32;
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = v;
  __syncthreads();
  v = partial[0];
  for (int w = 1; w < warps; ++w) v = op(v, partial[w]);
  __syncthreads();  // partial is free for the next reduction
  return v;
}

struct SumOp {
  template <typename V>
  __device__ __forceinline__ V operator()(V a, V b) const {
    return a + b;
  }
  template <typename A>
  __device__ __forceinline__ Pair<A> operator()(Pair<A> a, Pair<A> b) const {
    return {a.first + b.first, a.second + b.second};
  }
};

// __shfl_down_sync for any trivially copyable value, one 32-bit word at a time.
template <typename T>
__device__ __forceinline__ T shuffle_down(T value, int delta, int width) {
  static_assert(sizeof(T) % 4 == 0, "shuffled values are made of 32-bit words");
  constexpr int kWords = sizeof(T) / 4;
  uint32_t words[kWords];
  memcpy(words, &value, sizeof(T));
#pragma unroll
  for (int w = 0; w < kWords; ++w) words[w] = __shfl_down_sync(0xffffffffu, words[w], delta, width);
  memcpy(&value, words, sizeof(T));
  return value;
}

// Lane 0 of each aligned group of `width` lanes gets r.combine over the group, in lane order.
// Every lane of the warp must call it.
template <typename R, typename Acc>
__device__ __forceinline__ Acc group_reduce(const R& r, Acc acc, int width) {
  for (int delta = width / 2; delta > 0; delta /= 2) acc = r.combine(acc, shuffle_down(acc, delta, width));
  return acc;
}

// Thread 0 gets r.combine over the block, in thread order. Every thread must call it.
template <typename R, typename Acc>
__device__ Acc block_reduce(const R& r, Acc acc) {
  __shared__ alignas(16) unsigned char storage[32 * sizeof(Acc)];
  Acc* per_warp = reinterpret_cast<Acc*>(storage);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = (blockDim.x + 31) / 32;
  acc = group_reduce(r, acc, 32);
  if (lane == 0) per_warp[warp] = acc;
  __syncthreads();
  if (warp == 0) {
    acc = lane < warps ? per_warp[lane] : r.identity();
    acc = group_reduce(r, acc, 32);
  }
  return acc;
}

}  // namespace precis::cuda
