// Strided indexing: from the row-major index i of an element of a shape to the element
// offset of each of N operands, offset_k(i) = sum over dims d of digit_d(i) * stride_k[d],
// the digits of i in the mixed radix of the sizes (stride 0 along broadcast dims).
//
// On the host, merge_dims first drops size-1 dims and merges each dim into the one inside
// it wherever that is contiguous in every operand (as core/strided_loop.h's RowLoop), so a
// dense tensor is one dim and a transpose two; kernels take at most kMaxDims merged dims.
// On the device, two forms of the digit arithmetic:
//   StridedIndex    any size; 32-bit division where every index fits 32 bits (the ops'
//                   elementwise and reduction kernels).
//   StridedOffsets  indices below 2^31 only, each division a multiply-high, an add and a
//                   shift (FastDivider); the caller cuts larger tensors into pieces
//                   (core/cuda/copy.cu).
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "core/copy.h"
#include "core/shape.h"
#include "core/tensor.h"

namespace precis::cuda {

inline constexpr int kMaxDims = 8;

// Sizes and strides of N operands after merging, innermost dim first.
template <size_t N>
struct MergedDims {
  std::vector<int64_t> sizes;
  std::vector<std::array<int64_t, N>> strides;
};

template <size_t N>
MergedDims<N> merge_dims(const Shape& shape, const std::array<const Shape*, N>& strides) {
  MergedDims<N> dims;
  for (int64_t d = static_cast<int64_t>(shape.size()) - 1; d >= 0; --d) {
    if (shape[d] == 1) continue;
    bool merge = !dims.sizes.empty();
    for (size_t k = 0; k < N && merge; ++k) merge = (*strides[k])[d] == dims.strides.back()[k] * dims.sizes.back();
    if (merge) {
      dims.sizes.back() *= shape[d];
      continue;
    }
    dims.sizes.push_back(shape[d]);
    std::array<int64_t, N> s;
    for (size_t k = 0; k < N; ++k) s[k] = (*strides[k])[d];
    dims.strides.push_back(s);
  }
  return dims;
}

// Passed by value as a kernel parameter.
template <int N>
struct StridedIndex {
  int ndim = 0;
  bool index32 = true;  // every index fits 32 bits: cheaper division
  int64_t sizes[kMaxDims] = {};
  int64_t strides[N][kMaxDims] = {};

  __device__ __forceinline__ void offsets(int64_t linear, int64_t (&off)[N]) const {
#pragma unroll
    for (int k = 0; k < N; ++k) off[k] = 0;
    if (index32) {
      uint32_t rest = static_cast<uint32_t>(linear);
#pragma unroll
      for (int d = 0; d < kMaxDims; ++d) {
        if (d == ndim) break;
        uint32_t size = static_cast<uint32_t>(sizes[d]);
        uint32_t i = d + 1 == ndim ? rest : rest % size;
        rest /= size;
#pragma unroll
        for (int k = 0; k < N; ++k) off[k] += static_cast<int64_t>(i) * strides[k][d];
      }
    } else {
      int64_t rest = linear;
#pragma unroll
      for (int d = 0; d < kMaxDims; ++d) {
        if (d == ndim) break;
        int64_t i = d + 1 == ndim ? rest : rest % sizes[d];
        rest /= sizes[d];
#pragma unroll
        for (int k = 0; k < N; ++k) off[k] += i * strides[k][d];
      }
    }
  }
};

// The index of `shape` for operands with `strides`; false when more than kMaxDims dims remain.
template <int N>
bool make_strided_index(const Shape& shape, const std::array<Shape, N>& strides, StridedIndex<N>& index) {
  std::array<const Shape*, N> pointers;
  for (int k = 0; k < N; ++k) pointers[k] = &strides[k];
  const MergedDims<N> dims = merge_dims<N>(shape, pointers);
  index = StridedIndex<N>{};
  index.index32 = shape_numel(shape) <= static_cast<int64_t>(UINT32_MAX);
  if (dims.sizes.size() > static_cast<size_t>(kMaxDims)) return false;
  index.ndim = static_cast<int>(dims.sizes.size());
  for (int d = 0; d < index.ndim; ++d) {
    index.sizes[d] = dims.sizes[d];
    for (int k = 0; k < N; ++k) index.strides[k][d] = dims.strides[d][k];
  }
  return true;
}

// The index of `shape` over `operands` (views of that shape). Where more than kMaxDims
// dims would remain, the operands are replaced by dense copies first (a dense operand
// merges to one dim).
template <int N>
StridedIndex<N> index_over(const Shape& shape, std::array<Tensor, N>& operands) {
  std::array<Shape, N> strides;
  for (int k = 0; k < N; ++k) strides[k] = operands[k].strides();
  StridedIndex<N> index;
  if (!make_strided_index<N>(shape, strides, index)) {
    for (int k = 0; k < N; ++k) {
      operands[k] = dense(operands[k]);
      strides[k] = operands[k].strides();
    }
    make_strided_index<N>(shape, strides, index);
  }
  return index;
}

// index_over for a tensor's own elements in row-major order (t replaced by a dense copy where needed).
inline StridedIndex<1> index_over(Tensor& t) {
  std::array<Tensor, 1> operand{t};
  const StridedIndex<1> index = index_over<1>(t.shape(), operand);
  t = operand[0];
  return index;
}

// n / divisor as a multiply-high, an add and a shift (Granlund & Montgomery, as
// PyTorch's IntDivider). Exact for n and divisor below 2^31.
struct FastDivider {
  uint32_t divisor = 1;
  uint32_t magic = 1;
  uint32_t shift = 0;

  FastDivider() = default;
  explicit FastDivider(uint32_t d) : divisor(d) {
    while (shift < 32 && (uint32_t(1) << shift) < divisor) ++shift;
    uint64_t one = 1;
    magic = static_cast<uint32_t>(((one << 32) * ((one << shift) - divisor)) / divisor + 1);
  }
  __device__ uint32_t div(uint32_t n) const { return (__umulhi(n, magic) + n) >> shift; }
};

// Merged dims of fewer than 2^31 elements, for kernels that index in 32 bits.
template <size_t N>
struct StridedOffsets {
  int ndim = 0;
  FastDivider sizes[kMaxDims];
  int64_t strides[kMaxDims][N] = {};

  __device__ void get(uint32_t linear, int64_t (&offsets)[N]) const {
#pragma unroll
    for (size_t k = 0; k < N; ++k) offsets[k] = 0;
#pragma unroll
    for (int d = 0; d < kMaxDims; ++d) {
      if (d == ndim) break;
      if (d == ndim - 1) {  // the outermost dim: what is left of the index is its digit
#pragma unroll
        for (size_t k = 0; k < N; ++k) offsets[k] += static_cast<int64_t>(linear) * strides[d][k];
        break;
      }
      uint32_t quotient = sizes[d].div(linear);
      uint32_t digit = linear - quotient * sizes[d].divisor;
#pragma unroll
      for (size_t k = 0; k < N; ++k) offsets[k] += static_cast<int64_t>(digit) * strides[d][k];
      linear = quotient;
    }
  }
};

}  // namespace precis::cuda
