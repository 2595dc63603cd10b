#include "amp/float_format.h"

#include <bit>
#include <cmath>
#include <limits>

#include "core/convert.h"
#include "core/error.h"

namespace precis::amp {

double FloatFormat::max_finite() const {
  const int top_field = (1 << exponent_bits) - 1;
  // IEEE: the all-ones exponent is inf/NaN, so the largest is 1.11..1 x 2^(top - 1 - bias).
  // e4m3: the all-ones exponent holds numbers, all but S.1111.111 (NaN): 1.11..10 x 2^(top - bias).
  if (ieee_top) return (2.0 - std::ldexp(1.0, -mantissa_bits)) * std::ldexp(1.0, top_field - 1 - bias());
  return (2.0 - std::ldexp(1.0, 1 - mantissa_bits)) * std::ldexp(1.0, top_field - bias());
}
double FloatFormat::min_normal() const { return std::ldexp(1.0, min_exponent()); }
double FloatFormat::min_subnormal() const { return std::ldexp(1.0, min_exponent() - mantissa_bits); }
double FloatFormat::epsilon() const { return std::ldexp(1.0, -mantissa_bits); }

const std::vector<FloatFormat>& float_formats() {
  static const std::vector<FloatFormat> formats = {
      {"fp32", 8, 23, true, 32}, {"tf32", 8, 10, true, 32},    {"fp16", 5, 10, true, 16},
      {"bf16", 8, 7, true, 16},  {"fp8 e4m3", 4, 3, false, 8}, {"fp8 e5m2", 5, 2, true, 8},
  };
  return formats;
}

const FloatFormat& float_format(const std::string& name) {
  for (const FloatFormat& f : float_formats())
    if (f.name == name) return f;
  PRECIS_FAIL("unknown float format '", name, "': one of fp32, tf32, fp16, bf16, fp8 e4m3, fp8 e5m2");
}

const char* float_class_name(FloatClass c) {
  switch (c) {
    case FloatClass::zero:
      return "zero";
    case FloatClass::subnormal:
      return "subnormal";
    case FloatClass::normal:
      return "normal";
    case FloatClass::overflow:
      return "overflow";
    case FloatClass::nan:
      return "nan";
  }
  return "?";
}

namespace {

uint32_t sign_bit(const FloatFormat& f, bool negative) {
  return negative ? uint32_t{1} << (f.exponent_bits + f.mantissa_bits) : 0;
}

// The class, fields and neighbours of a stored magnitude `r` (finite, representable in `f`).
Rounded describe(const FloatFormat& f, double x, double r) {
  Rounded out;
  const bool negative = std::signbit(x);
  out.value = negative ? -r : r;
  const double quantum_min = f.min_subnormal();
  if (r == 0) {
    out.kind = FloatClass::zero;
    out.flushed = x != 0;
    out.gap_above = quantum_min;
    out.bits = sign_bit(f, negative);
    return out;
  }
  int e = 0;
  std::frexp(r, &e);
  const int exponent = std::max(e - 1, f.min_exponent());
  const double ulp = std::ldexp(1.0, exponent - f.mantissa_bits);
  uint32_t exponent_field = 0, mantissa_field = 0;
  if (r < f.min_normal()) {
    out.kind = FloatClass::subnormal;
    mantissa_field = static_cast<uint32_t>(r / quantum_min);
  } else {
    out.kind = FloatClass::normal;
    exponent_field = static_cast<uint32_t>(exponent + f.bias());
    mantissa_field = static_cast<uint32_t>((r / std::ldexp(1.0, exponent) - 1.0) * std::ldexp(1.0, f.mantissa_bits));
  }
  out.bits = sign_bit(f, negative) | exponent_field << f.mantissa_bits | mantissa_field;
  out.gap_above = r == f.max_finite() ? std::numeric_limits<double>::infinity() : ulp;
  // Below a power of two the spacing halves (unless it is the smallest normal's).
  out.gap_below = mantissa_field == 0 && out.kind == FloatClass::normal && exponent > f.min_exponent() ? ulp / 2 : ulp;
  return out;
}

Rounded overflowed(const FloatFormat& f, double x) {
  Rounded out;
  out.kind = FloatClass::overflow;
  const uint32_t top = ((uint32_t{1} << f.exponent_bits) - 1) << f.mantissa_bits;
  if (f.ieee_top) {
    out.value = std::copysign(std::numeric_limits<double>::infinity(), x);
    out.bits = sign_bit(f, std::signbit(x)) | top;
  } else {
    out.value = std::numeric_limits<double>::quiet_NaN();
    out.bits = sign_bit(f, std::signbit(x)) | top | ((uint32_t{1} << f.mantissa_bits) - 1);
  }
  out.gap_below = out.gap_above = std::numeric_limits<double>::quiet_NaN();
  return out;
}

Rounded not_a_number(const FloatFormat& f) {
  Rounded out = overflowed(f, 1.0);
  out.kind = FloatClass::nan;
  out.value = std::numeric_limits<double>::quiet_NaN();
  out.bits |= uint32_t{1} << (f.mantissa_bits - 1);
  return out;
}

// A value a host type stored: its class and neighbours from the format, its bits from the type.
template <typename T>
Rounded from_host(const FloatFormat& f, double x, T stored, uint32_t bits) {
  const double r = static_cast<double>(convert<float>(stored));
  if (std::isnan(r)) return not_a_number(f);
  Rounded out = std::isinf(r) ? overflowed(f, x) : describe(f, x, std::fabs(r));
  out.bits = bits;
  return out;
}

}  // namespace

Rounded round_minifloat(const FloatFormat& f, double x) {
  if (std::isnan(x)) return not_a_number(f);
  const double a = std::fabs(x);
  if (std::isinf(a)) return overflowed(f, x);
  if (a == 0) return describe(f, x, 0.0);
  int e = 0;
  std::frexp(a, &e);
  // The spacing of values near a: 2^(exponent - M), the exponent clamped at the subnormals'.
  const double quantum = std::ldexp(1.0, std::max(e - 1, f.min_exponent()) - f.mantissa_bits);
  const double r = std::nearbyint(a / quantum) * quantum;  // the default mode: nearest, ties to even
  if (r > f.max_finite()) return overflowed(f, x);
  return describe(f, x, r);
}

Rounded round_to(const FloatFormat& f, double x) {
  if (f.name == "fp32") {
    const float v = static_cast<float>(x);
    return from_host(f, x, v, std::bit_cast<uint32_t>(v));
  }
  if (f.name == "fp16") {
    const half v = convert<half>(static_cast<float>(x));
    return from_host(f, x, v, Eigen::numext::bit_cast<uint16_t>(v));
  }
  if (f.name == "bf16") {
    const bfloat16 v = convert<bfloat16>(static_cast<float>(x));
    return from_host(f, x, v, Eigen::numext::bit_cast<uint16_t>(v));
  }
  return round_minifloat(f, x);
}

std::string bit_fields(const FloatFormat& f, uint32_t bits) {
  std::string out;
  for (int i = f.total_bits() - 1; i >= 0; --i) {
    out += (bits >> i) & 1 ? '1' : '0';
    if (i == f.total_bits() - 1 || i == f.mantissa_bits) out += ' ';
  }
  return out;
}

}  // namespace precis::amp
