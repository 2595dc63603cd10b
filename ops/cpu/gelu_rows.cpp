#include "ops/cpu/gelu_rows.h"

#include <algorithm>

#include "ops/cpu/gelu.h"

// x86-64 only: elsewhere each function is compiled once, for the target's baseline. GCC does not
// inline the loops and the GELU formula into a clone by itself (then the AVX2 clone only calls
// baseline code): flatten makes it; clang inlines them and refuses flatten beside target_clones.
#if defined(__x86_64__) && defined(__clang__)
#define PRECIS_AVX2_CLONES [[gnu::target_clones("avx2", "default")]]
#elif defined(__x86_64__) && defined(__GNUC__)
#define PRECIS_AVX2_CLONES [[gnu::target_clones("avx2", "default"), gnu::flatten]]
#else
#define PRECIS_AVX2_CLONES
#endif

namespace precis::ops::cpu {

namespace {

// The rows of one output never overlap its bias or its saved pre-activation; the restrict
// qualifiers say so, so that the loops vectorise without a run-time overlap check.
template <typename T>
void bias_gelu(T* __restrict y, const T* __restrict bias, T* __restrict pre, int64_t width, bool gelu) {
  if (bias)
    for (int64_t j = 0; j < width; ++j) y[j] += bias[j];
  if (!gelu) return;
  if (pre) std::copy(y, y + width, pre);
  for (int64_t j = 0; j < width; ++j) y[j] = cpu::gelu(y[j]);
}

template <typename T>
void gelu_backward(T* d, const T* g, const T* __restrict z, int64_t width) {
  if (d == g) {  // in place
    T* __restrict dg = d;
    for (int64_t j = 0; j < width; ++j) dg[j] *= gelu_derivative(z[j]);
  } else {
    T* __restrict dd = d;
    const T* __restrict gg = g;
    for (int64_t j = 0; j < width; ++j) dd[j] = gg[j] * gelu_derivative(z[j]);
  }
}

}  // namespace

PRECIS_AVX2_CLONES void bias_gelu_row(float* y, const float* bias, float* pre, int64_t width, bool gelu) {
  bias_gelu(y, bias, pre, width, gelu);
}
void bias_gelu_row(double* y, const double* bias, double* pre, int64_t width, bool gelu) {
  bias_gelu(y, bias, pre, width, gelu);
}

PRECIS_AVX2_CLONES void gelu_backward_row(float* d, const float* g, const float* z, int64_t width) {
  gelu_backward(d, g, z, width);
}
void gelu_backward_row(double* d, const double* g, const double* z, int64_t width) { gelu_backward(d, g, z, width); }

}  // namespace precis::ops::cpu
