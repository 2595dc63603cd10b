// The formats of `precis formats` against known encodings (IEEE 754 binary32/binary16,
// bfloat16, OCP FP8 e4m3/e5m2) and the generic rounding against the host types.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <random>

#include "amp/float_format.h"
#include "core/convert.h"

namespace precis::amp {
namespace {

const FloatFormat& f(const char* name) { return float_format(name); }

TEST(FloatFormat, LimitsMatchTheStandards) {
  EXPECT_EQ(f("fp16").max_finite(), 65504.0);
  EXPECT_EQ(f("fp16").min_normal(), std::ldexp(1.0, -14));
  EXPECT_EQ(f("fp16").min_subnormal(), std::ldexp(1.0, -24));
  EXPECT_EQ(f("fp32").max_finite(), static_cast<double>(std::numeric_limits<float>::max()));
  EXPECT_EQ(f("fp32").min_subnormal(), static_cast<double>(std::numeric_limits<float>::denorm_min()));
  EXPECT_EQ(f("bf16").min_subnormal(), std::ldexp(1.0, -133));
  EXPECT_EQ(f("bf16").epsilon(), std::ldexp(1.0, -7));
  EXPECT_EQ(f("fp8 e4m3").max_finite(), 448.0);
  EXPECT_EQ(f("fp8 e4m3").min_subnormal(), std::ldexp(1.0, -9));
  EXPECT_EQ(f("fp8 e5m2").max_finite(), 57344.0);
  EXPECT_EQ(f("fp8 e5m2").min_subnormal(), std::ldexp(1.0, -16));
  EXPECT_EQ(f("tf32").epsilon(), std::ldexp(1.0, -10));
}

TEST(FloatFormat, KnownEncodings) {
  EXPECT_EQ(round_to(f("fp16"), 65504).bits, 0x7BFFu);
  EXPECT_EQ(round_to(f("fp16"), 1.0).bits, 0x3C00u);
  EXPECT_EQ(round_to(f("fp16"), -2.0).bits, 0xC000u);
  EXPECT_EQ(round_to(f("fp16"), std::ldexp(1.0, -24)).bits, 0x0001u);  // the smallest subnormal
  EXPECT_EQ(round_to(f("bf16"), 1.0).bits, 0x3F80u);
  EXPECT_EQ(round_to(f("fp32"), 1.0).bits, 0x3F800000u);
  EXPECT_EQ(round_to(f("tf32"), 1.0).bits, 0x1FC00u);
  EXPECT_EQ(round_to(f("fp8 e4m3"), 448).bits, 0x7Eu);
  EXPECT_EQ(round_to(f("fp8 e4m3"), 1.0).bits, 0x38u);
  EXPECT_EQ(round_to(f("fp8 e4m3"), std::ldexp(1.0, -9)).bits, 0x01u);
  EXPECT_EQ(round_to(f("fp8 e5m2"), 57344).bits, 0x7Bu);
  EXPECT_EQ(round_to(f("fp8 e5m2"), 1.0).bits, 0x3Cu);
  EXPECT_EQ(round_to(f("fp8 e5m2"), std::ldexp(1.0, -16)).bits, 0x01u);
  EXPECT_EQ(bit_fields(f("fp16"), 0x7BFF), "0 11110 1111111111");
}

TEST(FloatFormat, OverflowUnderflowAndSubnormals) {
  const Rounded big = round_to(f("fp16"), 70000);
  EXPECT_EQ(big.kind, FloatClass::overflow);
  EXPECT_TRUE(std::isinf(big.value));
  EXPECT_EQ(big.bits, 0x7C00u);
  // Halfway between 65504 and the next step (65536) rounds to even: overflow; just below stays.
  EXPECT_EQ(round_to(f("fp16"), 65519).kind, FloatClass::normal);
  EXPECT_EQ(round_to(f("fp16"), 65520).kind, FloatClass::overflow);
  // e4m3 has no inf: overflow is NaN (S.1111.111); 464 is halfway to 480 and rounds to 448.
  const Rounded e4 = round_to(f("fp8 e4m3"), 500);
  EXPECT_EQ(e4.kind, FloatClass::overflow);
  EXPECT_TRUE(std::isnan(e4.value));
  EXPECT_EQ(e4.bits, 0x7Fu);
  EXPECT_EQ(round_to(f("fp8 e4m3"), 464).value, 448.0);
  EXPECT_EQ(round_to(f("fp8 e5m2"), 70000).kind, FloatClass::overflow);

  const Rounded tiny = round_to(f("fp16"), 1e-8);
  EXPECT_EQ(tiny.kind, FloatClass::zero);
  EXPECT_TRUE(tiny.flushed);
  const Rounded sub = round_to(f("fp16"), 1e-5);
  EXPECT_EQ(sub.kind, FloatClass::subnormal);
  EXPECT_EQ(sub.gap_above, std::ldexp(1.0, -24));
  EXPECT_NEAR(sub.value, 1e-5, std::ldexp(1.0, -25));
  EXPECT_EQ(round_to(f("bf16"), 1e-8).kind, FloatClass::normal);  // fp32's range
}

TEST(FloatFormat, NeighboursAroundOne) {
  for (const FloatFormat& format : float_formats()) {
    const Rounded one = round_to(format, 1.0);
    EXPECT_EQ(one.gap_above, format.epsilon()) << format.name;
    EXPECT_EQ(one.gap_below, format.epsilon() / 2) << format.name;
    // The neighbours are representable and nothing lies between.
    EXPECT_EQ(round_to(format, 1.0 + one.gap_above).value, 1.0 + one.gap_above) << format.name;
    EXPECT_EQ(round_to(format, 1.0 + 0.49 * one.gap_above).value, 1.0) << format.name;
  }
  EXPECT_TRUE(std::isinf(round_to(f("fp16"), 65504).gap_above));
}

// The generic (E, M) rounding, which serves tf32 and fp8, gives the host types' value and bits
// for fp16, bf16 and fp32 on random magnitudes from subnormal to overflow, ties included.
TEST(FloatFormat, GenericRoundingMatchesTheHostTypes) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> exponent(-30, 20), mantissa(1, 2);
  for (int i = 0; i < 20000; ++i) {
    const float x = static_cast<float>((i % 2 ? -1 : 1) * mantissa(rng) * std::exp2(std::floor(exponent(rng))));
    for (const char* name : {"fp16", "bf16"}) {
      const Rounded host = round_to(f(name), x), generic = round_minifloat(f(name), x);
      ASSERT_EQ(host.bits, generic.bits) << name << " " << x;
      ASSERT_EQ(host.kind, generic.kind) << name << " " << x;
      if (std::isfinite(host.value)) {
        ASSERT_EQ(host.value, generic.value) << name << " " << x;
      }
    }
    const Rounded host = round_to(f("fp32"), x), generic = round_minifloat(f("fp32"), x);
    ASSERT_EQ(host.bits, generic.bits) << x;
  }
  // Exact ties between fp16 neighbours go to the even mantissa.
  const double tie = 1.0 + std::ldexp(1.0, -11);  // halfway between 1 and 1 + 2^-10
  EXPECT_EQ(round_minifloat(f("fp16"), tie).value, 1.0);
  EXPECT_EQ(round_minifloat(f("fp16"), tie + std::ldexp(1.0, -10)).value, 1.0 + std::ldexp(1.0, -9));
}

}  // namespace
}  // namespace precis::amp
