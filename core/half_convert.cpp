#include "core/half_convert.h"

#include "core/convert.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#include <immintrin.h>
#define PRECIS_X86_CONVERT 1
#else
#define PRECIS_X86_CONVERT 0
#endif

namespace precis {

namespace {

// The reference: convert<>() element by element. Also the tail of every vector loop, and
// the lanes the hardware would treat differently (NaNs through F16C, below).
template <typename To, typename From>
void convert_scalar(const From* in, To* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = convert<To>(in[i]);
}

#if PRECIS_X86_CONVERT
// GCC 12 warns inside its own AVX-512 intrinsics (their _mm512_undefined_* operands).
#pragma GCC diagnostic push
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

// F16C quiets a NaN and keeps its payload; Eigen's portable conversion (the scalar one in a
// build without -mf16c) writes the canonical NaN. Lanes holding a NaN, rare, are redone
// by the scalar conversion so that both agree in every build.
template <typename To, typename From>
void redo_lanes(const From* in, To* out, unsigned mask) {
  for (int lane = 0; mask != 0; ++lane, mask >>= 1)
    if (mask & 1) out[lane] = convert<To>(in[lane]);
}

// ---- AVX-512F: 16 lanes
__attribute__((target("avx512f,avx2,f16c"))) void f32_to_f16_avx512(const float* in, half* out, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 x = _mm512_loadu_ps(in + i);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i),
                        _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    const unsigned nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    if (nan) redo_lanes(in + i, out + i, nan);
  }
  convert_scalar(in + i, out + i, n - i);
}

// A half is a NaN exactly where its f32 is, so the NaN lanes are read off the output.
__attribute__((target("avx512f,avx2,f16c"))) void f16_to_f32_avx512(const half* in, float* out, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 x = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + i)));
    _mm512_storeu_ps(out + i, x);
    const unsigned nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    if (nan) redo_lanes(in + i, out + i, nan);
  }
  convert_scalar(in + i, out + i, n - i);
}

__attribute__((target("avx512f"))) void f32_to_bf16_avx512(const float* in, bfloat16* out, int64_t n) {
  const __m512i one = _mm512_set1_epi32(1), bias = _mm512_set1_epi32(0x7fff);
  const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff), inf = _mm512_set1_epi32(0x7f800000);
  const __m512i sign16 = _mm512_set1_epi32(0x8000), qnan = _mm512_set1_epi32(0x7fc0);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512i u = _mm512_loadu_si512(in + i);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), one);
    const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(bias, lsb)), 16);
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, abs_mask), inf);
    const __m512i quiet = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(u, 16), sign16), qnan);
    const __m512i result = _mm512_mask_blend_epi32(nan, rounded, quiet);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), _mm512_cvtepi32_epi16(result));
  }
  convert_scalar(in + i, out + i, n - i);
}

__attribute__((target("avx512f"))) void bf16_to_f32_avx512(const bfloat16* in, float* out, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512i h = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + i)));
    _mm512_storeu_si512(out + i, _mm512_slli_epi32(h, 16));
  }
  convert_scalar(in + i, out + i, n - i);
}

// ---- AVX2 + F16C: 8 lanes
__attribute__((target("avx2,f16c"))) void f32_to_f16_avx2(const float* in, half* out, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_loadu_ps(in + i);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i),
                     _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    const unsigned nan = _mm256_movemask_ps(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
    if (nan) redo_lanes(in + i, out + i, nan);
  }
  convert_scalar(in + i, out + i, n - i);
}

__attribute__((target("avx2,f16c"))) void f16_to_f32_avx2(const half* in, float* out, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i)));
    _mm256_storeu_ps(out + i, x);
    const unsigned nan = _mm256_movemask_ps(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
    if (nan) redo_lanes(in + i, out + i, nan);
  }
  convert_scalar(in + i, out + i, n - i);
}

__attribute__((target("avx2"))) void f32_to_bf16_avx2(const float* in, bfloat16* out, int64_t n) {
  const __m256i one = _mm256_set1_epi32(1), bias = _mm256_set1_epi32(0x7fff);
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
  const __m256i sign16 = _mm256_set1_epi32(0x8000), qnan = _mm256_set1_epi32(0x7fc0);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i u = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + i));
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), one);
    const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(bias, lsb)), 16);
    // |u| and inf are below 2^31, so the signed compare orders them as unsigned.
    const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, abs_mask), inf);
    const __m256i quiet = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(u, 16), sign16), qnan);
    const __m256i result = _mm256_blendv_epi8(rounded, quiet, nan);
    // packus works within 128-bit halves: [r0..r3 r0..r3 | r4..r7 r4..r7]; the permute puts
    // r0..r7 in the low half. Every value is below 2^16, so nothing saturates.
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(result, result), 0b1000);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), _mm256_castsi256_si128(packed));
  }
  convert_scalar(in + i, out + i, n - i);
}

__attribute__((target("avx2"))) void bf16_to_f32_avx2(const bfloat16* in, float* out, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i h = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), _mm256_slli_epi32(h, 16));
  }
  convert_scalar(in + i, out + i, n - i);
}
#pragma GCC diagnostic pop
#endif

// Calls the kernel of `isa` (avx512, avx2 or the portable loop).
template <typename To, typename From>
void convert_with(ConvertIsa isa, const From* in, To* out, int64_t n, void (*avx512)(const From*, To*, int64_t),
                  void (*avx2)(const From*, To*, int64_t)) {
  if (isa == ConvertIsa::avx512 && avx512) return avx512(in, out, n);
  if (isa == ConvertIsa::avx2 && avx2) return avx2(in, out, n);
  convert_scalar(in, out, n);
}

}  // namespace

#if PRECIS_X86_CONVERT
// F16C from CPUID leaf 1 (ECX bit 29): clang's __builtin_cpu_supports does not know "f16c".
bool cpu_has_f16c() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_F16C) != 0;
}
#endif

ConvertIsa best_convert_isa() {
#if PRECIS_X86_CONVERT
  static const ConvertIsa isa = [] {
    __builtin_cpu_init();
    const bool f16c = cpu_has_f16c();
    if (__builtin_cpu_supports("avx512f") && f16c) return ConvertIsa::avx512;
    if (__builtin_cpu_supports("avx2") && f16c) return ConvertIsa::avx2;
    return ConvertIsa::portable;
  }();
  return isa;
#else
  return ConvertIsa::portable;
#endif
}

#if PRECIS_X86_CONVERT
#define PRECIS_CONVERT_KERNELS(avx512, avx2) avx512, avx2
#else
#define PRECIS_CONVERT_KERNELS(avx512, avx2) nullptr, nullptr
#endif

void convert_n(const float* in, half* out, int64_t n, ConvertIsa isa) {
  convert_with<half, float>(isa, in, out, n, PRECIS_CONVERT_KERNELS(f32_to_f16_avx512, f32_to_f16_avx2));
}
void convert_n(const half* in, float* out, int64_t n, ConvertIsa isa) {
  convert_with<float, half>(isa, in, out, n, PRECIS_CONVERT_KERNELS(f16_to_f32_avx512, f16_to_f32_avx2));
}
void convert_n(const float* in, bfloat16* out, int64_t n, ConvertIsa isa) {
  convert_with<bfloat16, float>(isa, in, out, n, PRECIS_CONVERT_KERNELS(f32_to_bf16_avx512, f32_to_bf16_avx2));
}
void convert_n(const bfloat16* in, float* out, int64_t n, ConvertIsa isa) {
  convert_with<float, bfloat16>(isa, in, out, n, PRECIS_CONVERT_KERNELS(bf16_to_f32_avx512, bf16_to_f32_avx2));
}

}  // namespace precis
