// From a tensor's dtype to the device type its kernels are compiled for: dispatch_device
// calls fn(TypeTag<T>{}) with T the device type of `dtype` (core/cuda/convert.cuh), for the
// dtypes a launcher lists, and raises precis::Error with the launcher's words for any
// other. Only the listed types are instantiated, so a launcher compiles the kernels it
// serves and no more. The sets most launchers take have names below; data_of gives the
// typed pointer once the type is known.
#pragma once

#include <cstdint>
#include <utility>

#include "core/cuda/convert.cuh"
#include "core/error.h"
#include "core/tensor.h"

namespace precis::cuda {

template <DType kDType>
struct device_type_of;
template <>
struct device_type_of<DType::f32> {
  using type = float;
};
template <>
struct device_type_of<DType::f64> {
  using type = double;
};
template <>
struct device_type_of<DType::f16> {
  using type = __half;
};
template <>
struct device_type_of<DType::bf16> {
  using type = __nv_bfloat16;
};
template <>
struct device_type_of<DType::i32> {
  using type = int32_t;
};
template <>
struct device_type_of<DType::i64> {
  using type = int64_t;
};
template <>
struct device_type_of<DType::u8> {
  using type = uint8_t;
};
template <>
struct device_type_of<DType::boolean> {
  using type = bool;
};

// fn(TypeTag<device type of dtype>{}) when dtype is one of kDTypes, else PRECIS_FAIL(error...).
template <DType kFirst, DType... kRest, typename Fn, typename... Words>
decltype(auto) dispatch_device(DType dtype, Fn&& fn, const Words&... error) {
  if (dtype == kFirst) return fn(TypeTag<typename device_type_of<kFirst>::type>{});
  if constexpr (sizeof...(kRest) > 0) {
    return dispatch_device<kRest...>(dtype, std::forward<Fn>(fn), error...);
  } else {
    PRECIS_FAIL(error...);
  }
}

// Every dtype.
template <typename Fn>
decltype(auto) dispatch_any(DType dtype, const char* op, Fn&& fn) {
  return dispatch_device<DType::f32, DType::f64, DType::f16, DType::bf16, DType::i32, DType::i64, DType::u8,
                         DType::boolean>(dtype, std::forward<Fn>(fn), op, ": unknown dtype");
}

// f32, f64, f16, bf16.
template <typename Fn>
decltype(auto) dispatch_floating(DType dtype, const char* op, Fn&& fn) {
  return dispatch_device<DType::f32, DType::f64, DType::f16, DType::bf16>(
      dtype, std::forward<Fn>(fn), op, ": expected a floating tensor (float32, float64, float16, bfloat16), got ",
      dtype);
}

// The floating dtypes, then i32 and i64.
template <typename Fn>
decltype(auto) dispatch_numeric(DType dtype, const char* op, Fn&& fn) {
  return dispatch_device<DType::i32, DType::i64, DType::f32, DType::f64, DType::f16, DType::bf16>(
      dtype, std::forward<Fn>(fn), op, ": expected a floating tensor (float32, float64, float16, bfloat16), got ",
      dtype);
}

// The index dtypes (embedding indices, cross-entropy targets): i32, i64.
template <typename Fn>
decltype(auto) dispatch_index(DType dtype, const char* op, Fn&& fn) {
  return dispatch_device<DType::i32, DType::i64>(dtype, std::forward<Fn>(fn), op,
                                                 ": expected int32 or int64 indices, got ", dtype);
}

// The 16-bit floats the tensor-core kernels take: f16, bf16.
template <typename Fn>
decltype(auto) dispatch_half(DType dtype, const char* op, Fn&& fn) {
  return dispatch_device<DType::bf16, DType::f16>(dtype, std::forward<Fn>(fn), op, ": dtype ", dtype,
                                                  " is not supported (f16 or bf16)");
}

// The first element of `t` as a device pointer of type T (no dtype check: callers dispatched on it).
template <typename T>
T* data_of(const Tensor& t) {
  return static_cast<T*>(t.raw_data());
}

}  // namespace precis::cuda
