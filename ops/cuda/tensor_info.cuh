// What every elementwise and reduction kernel of ops/cuda/ shares: the device
// element types and their compute types, 16-byte packs, strided indexing of up
// to kMaxDims dims, and the stream a tensor's kernels run on.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <array>
#include <cstdint>
#include <type_traits>

#include "core/cuda/runtime.h"
#include "core/tensor.h"

namespace precis::ops::cuda {

// ---- element types

// The device type of a host element type: Eigen's half/bfloat16 have the bit layout of CUDA's.
template <typename T>
struct device_type {
  using type = T;
};
template <>
struct device_type<half> {
  using type = __half;
};
template <>
struct device_type<bfloat16> {
  using type = __nv_bfloat16;
};
template <typename T>
using device_t = typename device_type<T>::type;

// The type kernels compute in: float for the 16-bit floats (rounded back on store), the
// element type otherwise; the same rule as the CPU kernels' compute_type_t.
template <typename T>
inline constexpr bool is_half_v = std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>;
template <typename T>
using compute_t = std::conditional_t<is_half_v<T>, float, T>;

// Element conversion on the device. Halves round to nearest even, as Eigen's do on the host.
template <typename To, typename From>
__device__ __forceinline__ To convert_to(From v) {
  if constexpr (std::is_same_v<To, From>) {
    return v;
  } else if constexpr (std::is_same_v<From, __half>) {
    return static_cast<To>(__half2float(v));
  } else if constexpr (std::is_same_v<From, __nv_bfloat16>) {
    return static_cast<To>(__bfloat162float(v));
  } else if constexpr (std::is_same_v<To, __half>) {
    return __float2half_rn(static_cast<float>(v));
  } else if constexpr (std::is_same_v<To, __nv_bfloat16>) {
    return __float2bfloat16_rn(static_cast<float>(v));
  } else {
    return static_cast<To>(v);
  }
}

// Calls fn(TypeTag<device type>) for f32, f64, f16, bf16.
template <typename Fn>
decltype(auto) dispatch_floating(DType dtype, const char* op, Fn&& fn) {
  switch (dtype) {
    case DType::f32:
      return fn(TypeTag<float>{});
    case DType::f64:
      return fn(TypeTag<double>{});
    case DType::f16:
      return fn(TypeTag<__half>{});
    case DType::bf16:
      return fn(TypeTag<__nv_bfloat16>{});
    default:
      PRECIS_FAIL(op, ": expected a floating tensor (float32, float64, float16, bfloat16), got ", dtype);
  }
}

// dispatch_floating plus i32 and i64.
template <typename Fn>
decltype(auto) dispatch_numeric(DType dtype, const char* op, Fn&& fn) {
  switch (dtype) {
    case DType::i32:
      return fn(TypeTag<int32_t>{});
    case DType::i64:
      return fn(TypeTag<int64_t>{});
    default:
      return dispatch_floating(dtype, op, std::forward<Fn>(fn));
  }
}

// The first element of `t` as a device pointer of type T (no dtype check: callers dispatched on it).
template <typename T>
T* data_of(const Tensor& t) {
  return static_cast<T*>(t.raw_data());
}

// ---- 16-byte packs (llm.c's Packed128): one vector load or store moves 16 / sizeof(T) elements.
template <typename T>
struct alignas(16) Packed128 {
  static constexpr int size = 16 / sizeof(T);
  T v[size];
};

template <typename T>
__device__ __forceinline__ Packed128<T> load128(const T* p) {
  return *reinterpret_cast<const Packed128<T>*>(p);
}
template <typename T>
__device__ __forceinline__ void store128(T* p, const Packed128<T>& value) {
  *reinterpret_cast<Packed128<T>*>(p) = value;
}

inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// ---- strided indexing

inline constexpr int kMaxDims = 8;

// Maps the row-major index of an element of a shape to the element offsets of N operands
// with their own strides (0 along broadcast dims). Dims are stored innermost first, after
// dropping size-1 dims and merging dims that are contiguous in every operand, so a dense
// tensor is one dim. Passed by value as a kernel parameter.
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
  index = StridedIndex<N>{};
  index.index32 = shape_numel(shape) <= static_cast<int64_t>(UINT32_MAX);
  for (int64_t d = static_cast<int64_t>(shape.size()) - 1; d >= 0; --d) {
    if (shape[d] == 1) continue;
    if (index.ndim > 0) {
      // Merge into the inner dim when every operand steps over it exactly.
      const int inner = index.ndim - 1;
      bool merge = true;
      for (int k = 0; k < N && merge; ++k) merge = strides[k][d] == index.strides[k][inner] * index.sizes[inner];
      if (merge) {
        index.sizes[inner] *= shape[d];
        continue;
      }
    }
    if (index.ndim == kMaxDims) return false;
    index.sizes[index.ndim] = shape[d];
    for (int k = 0; k < N; ++k) index.strides[k][index.ndim] = strides[k][d];
    ++index.ndim;
  }
  return true;
}

// ---- launching

// Makes t's device current and returns its compute stream: every kernel of an op runs there, in order.
inline cudaStream_t stream_for(const Tensor& t) {
  precis::cuda::set_device(t.device());
  return precis::cuda::compute_stream(t.device());
}

}  // namespace precis::ops::cuda
