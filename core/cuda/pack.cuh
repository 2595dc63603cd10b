// Packed loads and stores: W elements (a power of two) moved by one aligned vector access.
//
// Why: a warp's 16-byte loads reach the full memory bandwidth where 2- or 4-byte loads
// do not. Pack<T, W> is W elements aligned to their size; Packed128<T> is the 16-byte
// pack (llm.c's Packed128). Arrays of mixed dtypes are visited with one W: the W of the
// narrowest makes 16-byte packs of it, 32-byte (two accesses) of a wider one.
// A row that does not start on a pack boundary is visited as a head of single
// elements, aligned packs, and a tail (for_each_in_row).
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

namespace precis::cuda {

template <typename T, int W>
struct alignas(sizeof(T) * W) Pack {
  static constexpr int size = W;
  T v[W];
};

template <typename T>
using Packed128 = Pack<T, 16 / sizeof(T)>;

template <int W, typename T>
__device__ __forceinline__ Pack<T, W> load_pack(const T* p) {
  return *reinterpret_cast<const Pack<T, W>*>(p);
}
template <int W, typename T>
__device__ __forceinline__ void store_pack(T* p, const Pack<T, W>& value) {
  *reinterpret_cast<Pack<T, W>*>(p) = value;
}

// Whether `p` is a multiple of `bytes` (a pack of that size may start there).
inline bool aligned(const void* p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }
inline bool aligned16(const void* p) { return aligned(p, 16); }

// A null pointer, or one at which a Pack<T, W> may start.
template <int W, typename T>
bool pack_aligned(const T* p) {
  return aligned(p, W * sizeof(T));
}

// Pointers whose addresses agree modulo 16 bytes: their rows cross 16-byte boundaries at the same elements.
inline bool same_phase16(const void* a, const void* b) {
  return (reinterpret_cast<uintptr_t>(a) - reinterpret_cast<uintptr_t>(b)) % 16 == 0;
}

// Element arrays (of any two types) that reach a W-element pack boundary at the same index:
// a + i starts a Pack<A, W> exactly where b + i starts a Pack<B, W>. A null b agrees with any a.
template <int W, typename A, typename B>
bool same_pack_phase(const A* a, const B* b) {
  if (!b) return true;
  const auto ua = reinterpret_cast<uintptr_t>(a), ub = reinterpret_cast<uintptr_t>(b);
  return ua % sizeof(A) == 0 && ub % sizeof(B) == 0 && ua / sizeof(A) % W == ub / sizeof(B) % W;
}

template <int W>
using Width = std::integral_constant<int, W>;

// Visits a row of n elements starting at `row` (any alignment) with `threads` threads:
// op(i, Width<1>) for the elements before the first kPack-element pack boundary and after the
// last, op(i, Width<kPack>) for each aligned pack in between (16 bytes for kPack =
// Packed128<T>::size). Arrays in the same phase as `row` (same_phase16, same_pack_phase) can
// be loaded at i with the same width. kPack 1 visits element by element.
template <int kPack, typename T, typename Op>
__device__ __forceinline__ void for_each_in_row(const T* row, int64_t n, int tid, int threads, Op&& op) {
  if constexpr (kPack == 1) {
    for (int64_t i = tid; i < n; i += threads) op(i, Width<1>{});
  } else {
    const int64_t misaligned = static_cast<int64_t>(reinterpret_cast<uintptr_t>(row) / sizeof(T) % kPack);
    const int64_t head = misaligned == 0 ? 0 : std::min<int64_t>(n, kPack - misaligned);
    const int64_t packs = (n - head) / kPack;
    const int64_t tail = head + packs * kPack;
    if (tid < head) op(static_cast<int64_t>(tid), Width<1>{});
    for (int64_t p = tid; p < packs; p += threads) op(head + p * kPack, Width<kPack>{});
    for (int64_t i = tail + tid; i < n; i += threads) op(i, Width<1>{});
  }
}

}  // namespace precis::cuda
