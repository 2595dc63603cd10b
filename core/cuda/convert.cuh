// Element types on the device and conversion between them, for every kernel of ours.
//
// The device type of a host element type: Eigen's half/bfloat16 (core/dtype.h) have the bit
// layout of CUDA's __half/__nv_bfloat16, so a tensor's bytes are read as either; dtype_of
// names the dtype of either.
// Kernels compute in compute_t<T>: float for the 16-bit floats (rounded back on store), the
// element type otherwise, the CPU kernels' rule (core/convert.h's compute_type_t).
// convert_to<To>(v) converts as core/convert.h's convert() does on the host, so a GPU result
// equals the CPU's bit for bit: 16-bit floats go through float and are rounded to nearest
// even, and anything converted to bool is "not zero".
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "core/dtype.h"

namespace precis::cuda {

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

}  // namespace precis::cuda

namespace precis {

// The dtype of a device type, as core/dtype.h's dtype_of for host types.
template <>
struct dtype_of<__half> {
  static constexpr DType value = DType::f16;
};
template <>
struct dtype_of<__nv_bfloat16> {
  static constexpr DType value = DType::bf16;
};

}  // namespace precis

namespace precis::cuda {

template <typename T>
inline constexpr bool is_half_v = std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>;
template <typename T>
using compute_t = std::conditional_t<is_half_v<T>, float, T>;

template <typename To, typename From>
__host__ __device__ __forceinline__ To convert_to(From value) {
  if constexpr (std::is_same_v<To, From>) {
    return value;
  } else if constexpr (std::is_same_v<From, __half>) {
    return convert_to<To>(__half2float(value));
  } else if constexpr (std::is_same_v<From, __nv_bfloat16>) {
    return convert_to<To>(__bfloat162float(value));
  } else if constexpr (std::is_same_v<To, bool>) {
    return value != From(0);
  } else if constexpr (std::is_same_v<To, __half>) {
    return __float2half_rn(static_cast<float>(value));
  } else if constexpr (std::is_same_v<To, __nv_bfloat16>) {
    return __float2bfloat16_rn(static_cast<float>(value));
  } else {
    return static_cast<To>(value);
  }
}

}  // namespace precis::cuda
