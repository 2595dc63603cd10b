// The floating-point formats of mixed precision side by side, for `precis formats`
// (docs/labs/01-formats.md): each format's parameters, a value rounded into it with
// its bit fields, its class (zero, subnormal, normal, overflow) and its neighbours.
//
// A format with E exponent bits and M stored mantissa bits has bias 2^(E-1) - 1; a
// normal value is (-1)^s 1.m 2^(e - bias), a subnormal (exponent field 0)
// (-1)^s 0.m 2^(1 - bias). IEEE-style formats (fp32, fp16, bf16, tf32, fp8 e5m2)
// keep the all-ones exponent for inf/NaN; fp8 e4m3 (OCP FP8, as H100 Tensor Cores
// take it) has no inf and keeps only S.1111.111 for NaN, so its largest finite
// value is 1.75 x 2^8 = 448.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace precis::amp {

struct FloatFormat {
  std::string name;    // "fp16"
  int exponent_bits;   // E
  int mantissa_bits;   // M, stored (a normal value has M + 1 significant bits)
  bool ieee_top;       // the all-ones exponent means inf/NaN (false: e4m3)
  int container_bits;  // bits of the word it is held in (tf32: an fp32 register)

  int total_bits() const { return 1 + exponent_bits + mantissa_bits; }
  int bias() const { return (1 << (exponent_bits - 1)) - 1; }
  int min_exponent() const { return 1 - bias(); }  // of the smallest normal
  double max_finite() const;
  double min_normal() const;
  double min_subnormal() const;
  double epsilon() const;  // the gap above 1: 2^-M
};

// fp32, tf32, fp16, bf16, fp8 e4m3, fp8 e5m2, in that order.
const std::vector<FloatFormat>& float_formats();
const FloatFormat& float_format(const std::string& name);

enum class FloatClass { zero, subnormal, normal, overflow, nan };
const char* float_class_name(FloatClass c);

struct Rounded {
  double value = 0;   // the stored value (inf or NaN on overflow)
  uint32_t bits = 0;  // sign, exponent and mantissa fields, total_bits() wide
  FloatClass kind = FloatClass::zero;
  bool flushed = false;  // a nonzero input that rounded to zero (underflow)
  double gap_below = 0;  // distance to the next smaller magnitude (0 at zero)
  double gap_above = 0;  // distance to the next larger magnitude (inf at the largest)
};

// `x` rounded to nearest, ties to even, into `format`. fp32, fp16 and bf16 go through
// the host types of core/dtype.h (float, Eigen::half, Eigen::bfloat16; the 16-bit ones
// from the fp32 value, as a cast on the GPU does); tf32 and the fp8 formats, which have
// no host type, through round_minifloat.
Rounded round_to(const FloatFormat& format, double x);

// Round to nearest even into any (E, M) format, from the format's parameters alone:
// magnitudes whose rounding exceeds max_finite() overflow. The tests check it against the
// host types on fp16 and bf16.
Rounded round_minifloat(const FloatFormat& format, double x);

// The fields of `bits` as "s eeeee mmmmmmmmmm".
std::string bit_fields(const FloatFormat& format, uint32_t bits);

}  // namespace precis::amp
