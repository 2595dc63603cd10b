// convert_n (core/half_convert.h) against convert<>() element by element, bit for bit, on
// every instruction set this CPU has: every f16 and bf16 pattern widened to f32, and f32
// patterns narrowed: every value of the narrow type, the ties halfway between neighbours
// and their f32 neighbours, NaNs with payloads, f32 subnormals, and a random sample.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "core/convert.h"
#include "core/half_convert.h"

using namespace precis;

namespace {

uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float float_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
template <typename H>
uint16_t bits_of(H h) {
  return Eigen::numext::bit_cast<uint16_t>(h);
}
template <typename H>
H half_of(uint16_t u) {
  return Eigen::numext::bit_cast<H>(u);
}

std::vector<ConvertIsa> isas_of_this_cpu() {
  std::vector<ConvertIsa> isas = {ConvertIsa::portable};
  if (best_convert_isa() >= ConvertIsa::avx2) isas.push_back(ConvertIsa::avx2);
  if (best_convert_isa() >= ConvertIsa::avx512) isas.push_back(ConvertIsa::avx512);
  return isas;
}

const char* isa_name(ConvertIsa isa) {
  return isa == ConvertIsa::avx512 ? "avx512" : isa == ConvertIsa::avx2 ? "avx2" : "portable";
}

template <typename H>
std::vector<H> every_pattern() {
  std::vector<H> all(65536);
  for (uint32_t u = 0; u < 65536; ++u) all[u] = half_of<H>(static_cast<uint16_t>(u));
  return all;
}

// f32 inputs that probe narrowing to H: each value of H, the tie halfway to the next one
// up (round to nearest even decides it), and one f32 ulp either side of both; NaNs with
// payloads in every bit; f32 subnormals; then random patterns.
template <typename H>
std::vector<float> narrowing_probes(size_t random_count) {
  std::vector<float> probes;
  for (uint32_t u = 0; u < 65536; ++u) {
    const float value = static_cast<float>(half_of<H>(static_cast<uint16_t>(u)));
    if (!std::isfinite(value)) continue;
    const float next = static_cast<float>(half_of<H>(static_cast<uint16_t>(u + 1)));
    const float tie = std::isfinite(next) ? static_cast<float>((static_cast<double>(value) + next) / 2)
                                          : std::nextafter(value, std::numeric_limits<float>::infinity());
    for (float f : {value, tie}) {
      probes.push_back(f);
      probes.push_back(float_of(bits_of(f) + 1));
      probes.push_back(float_of(bits_of(f) - 1));
    }
  }
  for (uint32_t sign : {0u, 0x80000000u}) {
    for (int bit = 0; bit < 23; ++bit) probes.push_back(float_of(sign | 0x7f800000u | (1u << bit)));  // NaNs
    probes.push_back(float_of(sign | 0x7fffffffu));
    probes.push_back(float_of(sign | 0x7f800000u));                                           // inf
    for (uint32_t m = 1; m < 0x800000u; m = m * 3 + 1) probes.push_back(float_of(sign | m));  // subnormals
  }
  std::mt19937 rng(20261126);
  for (size_t i = 0; i < random_count; ++i) probes.push_back(float_of(static_cast<uint32_t>(rng())));
  return probes;
}

// Converts `in` with convert_n from offset 1 (an unaligned start, and a length that leaves a
// tail for the scalar loop) and checks every element against convert<To>().
template <typename To, typename From>
void expect_same_bits_as_scalar(const std::vector<From>& in, ConvertIsa isa) {
  const int64_t n = static_cast<int64_t>(in.size()) - 1;
  std::vector<To> out(in.size());
  convert_n(in.data() + 1, out.data() + 1, n, isa);
  int64_t mismatches = 0;
  for (int64_t i = 1; i <= n; ++i) {
    const To expected = convert<To>(in[i]);
    if (bits_of(out[i]) != bits_of(expected) && ++mismatches <= 5) {
      ADD_FAILURE() << isa_name(isa) << ": input bits 0x" << std::hex << bits_of(in[i]) << " gave 0x" << bits_of(out[i])
                    << ", convert<>() gives 0x" << bits_of(expected);
    }
  }
  EXPECT_EQ(mismatches, 0) << isa_name(isa);
}

}  // namespace

TEST(HalfConvert, TheScalarReferenceRoundsToNearestEven) {
  // f16: 1 + 2^-11 is the tie between 1 and 1 + 2^-10 and goes to the even 1; 1 + 3 * 2^-11
  // goes up to the even 1 + 2^-9; 2^-24 is the smallest subnormal; 65520 overflows to inf.
  EXPECT_EQ(bits_of(convert<half>(1.0f + 0x1p-11f)), 0x3c00);
  EXPECT_EQ(bits_of(convert<half>(1.0f + 3 * 0x1p-11f)), 0x3c02);
  EXPECT_EQ(bits_of(convert<half>(0x1p-24f)), 0x0001);
  EXPECT_EQ(bits_of(convert<half>(65520.0f)), 0x7c00);
  EXPECT_EQ(bits_of(convert<half>(-std::numeric_limits<float>::quiet_NaN())) & 0xfe00, 0xfe00);
  // bf16: the same ties one bit above f32's 16 dropped bits, and NaN kept a NaN.
  EXPECT_EQ(bits_of(convert<bfloat16>(float_of(0x3f808000u))), 0x3f80);
  EXPECT_EQ(bits_of(convert<bfloat16>(float_of(0x3f818000u))), 0x3f82);
  EXPECT_EQ(bits_of(convert<bfloat16>(float_of(0x3f808001u))), 0x3f81);
  EXPECT_EQ(bits_of(convert<bfloat16>(float_of(0x7f800001u))), 0x7fc0);
  EXPECT_EQ(bits_of(convert<bfloat16>(float_of(0x00000001u))), 0x0000);
  EXPECT_EQ(bits_of(convert<bfloat16>(float_of(0x00008000u))), 0x0000);
  EXPECT_EQ(bits_of(convert<bfloat16>(float_of(0x00018000u))), 0x0002);
}

TEST(HalfConvert, EveryF16PatternWidensAsTheScalarConversion) {
  for (ConvertIsa isa : isas_of_this_cpu()) expect_same_bits_as_scalar<float>(every_pattern<half>(), isa);
}

TEST(HalfConvert, EveryBf16PatternWidensAsTheScalarConversion) {
  for (ConvertIsa isa : isas_of_this_cpu()) expect_same_bits_as_scalar<float>(every_pattern<bfloat16>(), isa);
}

TEST(HalfConvert, F32NarrowsToF16AsTheScalarConversion) {
  const std::vector<float> probes = narrowing_probes<half>(1 << 21);
  for (ConvertIsa isa : isas_of_this_cpu()) expect_same_bits_as_scalar<half>(probes, isa);
}

TEST(HalfConvert, F32NarrowsToBf16AsTheScalarConversion) {
  const std::vector<float> probes = narrowing_probes<bfloat16>(1 << 22);
  for (ConvertIsa isa : isas_of_this_cpu()) expect_same_bits_as_scalar<bfloat16>(probes, isa);
}

// Every length from 0 to 40 (whole vectors, tails, both) converts every element it is given
// and writes nothing past the end.
TEST(HalfConvert, EveryLengthConvertsExactlyItsElements) {
  std::vector<float> in(40);
  for (size_t i = 0; i < in.size(); ++i) in[i] = 0.5f + static_cast<float>(i);
  for (ConvertIsa isa : isas_of_this_cpu()) {
    for (int64_t n = 0; n <= 40; ++n) {
      std::vector<bfloat16> out(41, half_of<bfloat16>(0xdead));
      convert_n(in.data(), out.data(), n, isa);
      for (int64_t i = 0; i < n; ++i) EXPECT_EQ(static_cast<float>(out[i]), in[i]) << isa_name(isa) << " n=" << n;
      EXPECT_EQ(bits_of(out[n]), 0xdead) << isa_name(isa) << " n=" << n;
      std::vector<float> back(41, -1.0f);
      std::vector<half> h(40);
      convert_n(in.data(), h.data(), n, isa);
      convert_n(h.data(), back.data(), n, isa);
      for (int64_t i = 0; i < n; ++i) EXPECT_EQ(back[i], in[i]) << isa_name(isa) << " n=" << n;
      EXPECT_EQ(back[n], -1.0f) << isa_name(isa) << " n=" << n;
    }
  }
}
