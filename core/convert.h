// convert<To>(from): element conversion between any two host element types,
// through float for the 16-bit float types (Eigen::half, Eigen::bfloat16).
#pragma once

#include <type_traits>

#include "core/dtype.h"

namespace precis {

template <typename T>
inline constexpr bool is_half_type = std::is_same_v<T, half> || std::is_same_v<T, bfloat16>;

template <typename To, typename From>
inline To convert(From value) {
  if constexpr (std::is_same_v<To, From>) {
    return value;
  } else if constexpr (is_half_type<From>) {
    return convert<To>(static_cast<float>(value));
  } else if constexpr (std::is_same_v<To, bool>) {
    return value != From(0);
  } else if constexpr (is_half_type<To>) {
    return To(static_cast<float>(value));
  } else {
    return static_cast<To>(value);
  }
}

// The type CPU kernels compute in for elements of type T: float for the 16-bit
// floats (rounded back on store), T otherwise.
template <typename T>
using compute_type_t = std::conditional_t<is_half_type<T>, float, T>;

}  // namespace precis
