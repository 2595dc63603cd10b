#include "core/dtype.h"

#include <algorithm>

namespace precis {

size_t element_size(DType dtype) {
  switch (dtype) {
    case DType::f64:
    case DType::i64:
      return 8;
    case DType::f32:
    case DType::i32:
      return 4;
    case DType::f16:
    case DType::bf16:
      return 2;
    case DType::u8:
    case DType::boolean:
      return 1;
  }
  return 0;
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return "float32";
    case DType::f64:
      return "float64";
    case DType::f16:
      return "float16";
    case DType::bf16:
      return "bfloat16";
    case DType::i32:
      return "int32";
    case DType::i64:
      return "int64";
    case DType::u8:
      return "uint8";
    case DType::boolean:
      return "bool";
  }
  return "?";
}

DType parse_dtype(const std::string& raw) {
  std::string name = raw;
  std::transform(name.begin(), name.end(), name.begin(), ::tolower);
  if (name == "f32" || name == "float32" || name == "float" || name == "fp32") return DType::f32;
  if (name == "f64" || name == "float64" || name == "double" || name == "fp64") return DType::f64;
  if (name == "f16" || name == "float16" || name == "half" || name == "fp16") return DType::f16;
  if (name == "bf16" || name == "bfloat16") return DType::bf16;
  if (name == "i32" || name == "int32") return DType::i32;
  if (name == "i64" || name == "int64" || name == "long") return DType::i64;
  if (name == "u8" || name == "uint8") return DType::u8;
  if (name == "bool") return DType::boolean;
  PRECIS_FAIL("unknown dtype '", raw, "': use one of float32, float64, float16, bfloat16, int32, int64, uint8, bool");
}

bool is_floating(DType dtype) {
  return dtype == DType::f32 || dtype == DType::f64 || dtype == DType::f16 || dtype == DType::bf16;
}

namespace {
// Rank within a category: larger holds more.
int float_rank(DType d) {
  switch (d) {
    case DType::f16:
    case DType::bf16:
      return 1;
    case DType::f32:
      return 2;
    case DType::f64:
      return 3;
    default:
      return 0;
  }
}
int int_rank(DType d) {
  switch (d) {
    case DType::boolean:
      return 0;
    case DType::u8:
      return 1;
    case DType::i32:
      return 2;
    case DType::i64:
      return 3;
    default:
      return -1;
  }
}
}  // namespace

DType promote_types(DType a, DType b) {
  if (a == b) return a;
  bool fa = is_floating(a), fb = is_floating(b);
  if (fa && !fb) return a;
  if (fb && !fa) return b;
  if (fa && fb) {
    if (float_rank(a) == float_rank(b)) return DType::f32;  // f16 with bf16
    return float_rank(a) > float_rank(b) ? a : b;
  }
  return int_rank(a) > int_rank(b) ? a : b;
}

}  // namespace precis
