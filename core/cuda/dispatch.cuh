// From a tensor's dtype to the device type its kernels are compiled for: dispatch_device
// calls fn(TypeTag<T>{}) with T the device type of `dtype` (core/cuda/convert.cuh), for the
// device types a launcher lists, and raises precis::Error with the launcher's words for
// any other dtype. Only the listed types are instantiated, so a launcher compiles the kernels it
// serves and no more. The sets most launchers take have names below; data_of gives the
// typed pointer once the type is known.
#pragma once

#include <cstdint>
#include <utility>

#include "core/cuda/convert.cuh"
#include "core/error.h"
#include "core/tensor.h"

namespace precis::cuda {

// dispatch_types (core/dtype.h) over device types: the one dispatch, named for kernels' launchers.
template <typename... Ts, typename Fn, typename... Words>
decltype(auto) dispatch_device(DType dtype, Fn&& fn, const Words&... error) {
  return dispatch_types<Ts...>(dtype, std::forward<Fn>(fn), error...);
}

// Every dtype.
template <typename Fn>
decltype(auto) dispatch_any(DType dtype, const char* op, Fn&& fn) {
  return dispatch_device<float, double, __half, __nv_bfloat16, int32_t, int64_t, uint8_t, bool>(
      dtype, std::forward<Fn>(fn), op, ": unknown dtype");
}

// f32, f64, f16, bf16.
template <typename Fn>
decltype(auto) dispatch_floating(DType dtype, const char* op, Fn&& fn) {
  return dispatch_device<float, double, __half, __nv_bfloat16>(
      dtype, std::forward<Fn>(fn), op, ": expected a floating tensor (float32, float64, float16, bfloat16), got ",
      dtype);
}

// The floating dtypes, then i32 and i64.
template <typename Fn>
decltype(auto) dispatch_numeric(DType dtype, const char* op, Fn&& fn) {
  return dispatch_device<int32_t, int64_t, float, double, __half, __nv_bfloat16>(
      dtype, std::forward<Fn>(fn), op, ": expected a floating tensor (float32, float64, float16, bfloat16), got ",
      dtype);
}

// The index dtypes (embedding indices, cross-entropy targets): i32, i64.
template <typename Fn>
decltype(auto) dispatch_index(DType dtype, const char* op, Fn&& fn) {
  return dispatch_device<int32_t, int64_t>(dtype, std::forward<Fn>(fn), op, ": expected int32 or int64 indices, got ",
                                           dtype);
}

// The 16-bit floats the tensor-core kernels take: f16, bf16.
template <typename Fn>
decltype(auto) dispatch_half(DType dtype, const char* op, Fn&& fn) {
  return dispatch_device<__nv_bfloat16, __half>(dtype, std::forward<Fn>(fn), op, ": dtype ", dtype,
                                                " is not supported (f16 or bf16)");
}

// The first element of `t` as a device pointer of type T (no dtype check: callers dispatched on it).
template <typename T>
T* data_of(const Tensor& t) {
  return static_cast<T*>(t.raw_data());
}

}  // namespace precis::cuda
