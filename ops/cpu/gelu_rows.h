// The GELU passes of the fused linear kernels (ops/cpu/linear.cpp) over one row, with the formula
// of ops/cpu/gelu.h. They are the fused kernels' only arithmetic outside the GEMMs, so they are
// compiled twice, for AVX2 (8 floats a vector) and for the x86-64 baseline (SSE2, 4), and the
// loader picks the one the running CPU takes (target_clones: an ifunc resolved once at start).
// The rest of the program stays baseline code; the AVX2 clone enables no FMA, so both clones
// round every operation alike and give the same bits.
#pragma once

#include <cstdint>

namespace precis::ops::cpu {

// y[j] += bias[j] (when bias), then, when gelu: pre[j] = y[j] (when pre) and y[j] = gelu(y[j]).
void bias_gelu_row(float* y, const float* bias, float* pre, int64_t width, bool gelu);
void bias_gelu_row(double* y, const double* bias, double* pre, int64_t width, bool gelu);

// d[j] = g[j] * gelu'(z[j]); d may be g (in place).
void gelu_backward_row(float* d, const float* g, const float* z, int64_t width);
void gelu_backward_row(double* d, const double* g, const double* z, int64_t width);

}  // namespace precis::ops::cpu
