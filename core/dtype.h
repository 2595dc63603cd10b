// Element types: sizes, names, promotion, and the host C++ type of each.
#pragma once

#include <Eigen/Core>
#include <cstdint>
#include <ostream>
#include <string>

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

// Calls fn(TypeTag<T>{}) with T the host type of `dtype`. `op` names the caller
// in the error raised for dtypes it does not support.
template <typename Fn>
decltype(auto) dispatch_all(DType dtype, const char* op, Fn&& fn) {
  switch (dtype) {
    case DType::f32:
      return fn(TypeTag<float>{});
    case DType::f64:
      return fn(TypeTag<double>{});
    case DType::f16:
      return fn(TypeTag<half>{});
    case DType::bf16:
      return fn(TypeTag<bfloat16>{});
    case DType::i32:
      return fn(TypeTag<int32_t>{});
    case DType::i64:
      return fn(TypeTag<int64_t>{});
    case DType::u8:
      return fn(TypeTag<uint8_t>{});
    case DType::boolean:
      return fn(TypeTag<bool>{});
  }
  PRECIS_FAIL(op, ": unknown dtype");
}

// f32 and f64 only: the dtypes CPU kernels compute in (f16/bf16 are widened to f32 first).
template <typename Fn>
decltype(auto) dispatch_f32_f64(DType dtype, const char* op, Fn&& fn) {
  switch (dtype) {
    case DType::f32:
      return fn(TypeTag<float>{});
    case DType::f64:
      return fn(TypeTag<double>{});
    default:
      PRECIS_FAIL(op, ": expected a float32 or float64 tensor, got ", dtype_name(dtype));
  }
}

}  // namespace precis
