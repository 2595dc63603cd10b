// Element types: sizes, names, promotion, and the host C++ type of each.
#pragma once

#include <Eigen/Core>
#include <cstdint>
#include <ostream>
#include <string>
#include <utility>

#include "core/error.h"

namespace precis {

enum class DType : uint8_t { f32, f64, f16, bf16, i32, i64, u8, boolean };

using half = Eigen::half;
using bfloat16 = Eigen::bfloat16;

size_t element_size(DType dtype);
const char* dtype_name(DType dtype);
// Accepts "f32"/"float32"/"float", "f16"/"float16"/"half", "bf16"/"bfloat16", ...
DType parse_dtype(const std::string& name);
bool is_floating(DType dtype);
// Type promotion as PyTorch does it for two tensors: float beats int, wider
// beats narrower, and f16 with bf16 gives f32 (neither holds the other).
DType promote_types(DType a, DType b);

inline std::ostream& operator<<(std::ostream& out, DType dtype) { return out << dtype_name(dtype); }

template <typename T>
struct dtype_of;
template <>
struct dtype_of<float> {
  static constexpr DType value = DType::f32;
};
template <>
struct dtype_of<double> {
  static constexpr DType value = DType::f64;
};
template <>
struct dtype_of<half> {
  static constexpr DType value = DType::f16;
};
template <>
struct dtype_of<bfloat16> {
  static constexpr DType value = DType::bf16;
};
template <>
struct dtype_of<int32_t> {
  static constexpr DType value = DType::i32;
};
template <>
struct dtype_of<int64_t> {
  static constexpr DType value = DType::i64;
};
template <>
struct dtype_of<uint8_t> {
  static constexpr DType value = DType::u8;
};
template <>
struct dtype_of<bool> {
  static constexpr DType value = DType::boolean;
};

template <typename T>
struct TypeTag {
  using type = T;
};

// The one dtype dispatch, for host and device code alike: calls fn(TypeTag<T>{}) for the T of
// Ts whose dtype_of is `dtype`, and raises precis::Error(error...) for any other dtype. Only the
// listed types are instantiated, so a caller compiles the code it serves and no more. The sets
// the CPU kernels take are named below (ops/cpu/loops.h adds theirs); core/cuda/dispatch.cuh
// names the device's, whose 16-bit types are CUDA's __half/__nv_bfloat16.
template <typename T, typename... Ts, typename Fn, typename... Words>
decltype(auto) dispatch_types(DType dtype, Fn&& fn, const Words&... error) {
  if (dtype == dtype_of<T>::value) return fn(TypeTag<T>{});
  if constexpr (sizeof...(Ts) > 0) {
    return dispatch_types<Ts...>(dtype, std::forward<Fn>(fn), error...);
  } else {
    PRECIS_FAIL(error...);
  }
}

// Every dtype, with T the host type. `op` names the caller in the error.
template <typename Fn>
decltype(auto) dispatch_all(DType dtype, const char* op, Fn&& fn) {
  return dispatch_types<float, double, half, bfloat16, int32_t, int64_t, uint8_t, bool>(dtype, std::forward<Fn>(fn), op,
                                                                                        ": unknown dtype");
}

// f32 and f64 only: the dtypes CPU kernels compute in (f16/bf16 are widened to f32 first).
template <typename Fn>
decltype(auto) dispatch_f32_f64(DType dtype, const char* op, Fn&& fn) {
  return dispatch_types<float, double>(dtype, std::forward<Fn>(fn), op, ": expected a float32 or float64 tensor, got ",
                                       dtype_name(dtype));
}

}  // namespace precis
