// convert_n: bulk conversion of n contiguous elements between f32 and the 16-bit floats,
// with the same bits as convert<>() (core/convert.h) element by element, vectorised where
// the CPU can:
//   f32 <-> f16:  F16C's vcvtps2ph / vcvtph2ps (round to nearest even, subnormals kept);
//   f32 <-> bf16: integer arithmetic on the f32 bits (as Eigen's scalar conversion does):
//                 bf16 = (bits + 0x7fff + ((bits >> 16) & 1)) >> 16, round to nearest even,
//                 a NaN becomes the quiet NaN 0x7fc0 with its sign; bf16 -> f32 is bits << 16.
// AVX-512 BF16's vcvtneps2bf16 is not used: it flushes subnormal inputs to zero, so its
// bits differ from the scalar conversion's.
//
// The instruction set is picked at run time (the widest the CPU has), so a build for any
// x86-64 uses AVX-512 or AVX2 + F16C where they exist; elsewhere the portable loop runs.
#pragma once

#include <cstdint>
#include <type_traits>

#include "core/dtype.h"

namespace precis {

enum class ConvertIsa { portable, avx2, avx512 };

// The widest instruction set this CPU runs convert_n with.
ConvertIsa best_convert_isa();

void convert_n(const float* in, half* out, int64_t n, ConvertIsa isa = best_convert_isa());
void convert_n(const half* in, float* out, int64_t n, ConvertIsa isa = best_convert_isa());
void convert_n(const float* in, bfloat16* out, int64_t n, ConvertIsa isa = best_convert_isa());
void convert_n(const bfloat16* in, float* out, int64_t n, ConvertIsa isa = best_convert_isa());

// True for the (To, From) pairs convert_n takes.
template <typename To, typename From>
inline constexpr bool has_convert_n = (std::is_same_v<From, float> &&
                                       (std::is_same_v<To, half> || std::is_same_v<To, bfloat16>)) ||
                                      (std::is_same_v<To, float> &&
                                       (std::is_same_v<From, half> || std::is_same_v<From, bfloat16>));

}  // namespace precis
