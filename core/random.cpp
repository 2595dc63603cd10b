#include "core/random.h"

#include <cmath>

#include "core/copy.h"
#include "core/philox.h"

namespace precis {

Generator& default_generator() {
  static Generator gen(0);
  return gen;
}

void manual_seed(uint64_t seed) { default_generator().manual_seed(seed); }

namespace {

// Fills a float64 buffer with `n` values, element i from word i of the reserved stream.
template <typename Fn>
Tensor draw(const Shape& shape, DType dtype, Generator* gen, Fn&& value_of_word) {
  Generator& g = gen ? *gen : default_generator();
  int64_t n = shape_numel(shape);
  uint64_t offset = g.reserve(static_cast<uint64_t>(n));
  Tensor values = empty(shape, DType::f64);
  double* out = values.data<double>();
#pragma omp parallel for schedule(static) if (n >= 65536)
  for (int64_t i = 0; i < n; ++i) out[i] = value_of_word(g.seed(), offset, static_cast<uint64_t>(i));
  if (dtype == DType::f64) return values;
  Tensor result = empty(shape, dtype);
  copy_(result, values);
  return result;
}

}  // namespace

Tensor rand(const Shape& shape, DType dtype, Generator* gen, double low, double high) {
  PRECIS_CHECK(is_floating(dtype), "rand: dtype must be floating, got ", dtype);
  return draw(shape, dtype, gen, [=](uint64_t seed, uint64_t offset, uint64_t i) {
    return low + (high - low) * uniform_from_bits(philox_word(seed, offset, i));
  });
}

Tensor randn(const Shape& shape, DType dtype, Generator* gen, double mean, double std) {
  PRECIS_CHECK(is_floating(dtype), "randn: dtype must be floating, got ", dtype);
  // Each Philox block of 4 words gives 4 normals: words (0, 1) give elements 0 and 2 (the
  // cosine and sine of one Box-Muller pair), words (2, 3) give elements 1 and 3.
  return draw(shape, dtype, gen, [=](uint64_t seed, uint64_t offset, uint64_t i) {
    Philox4 r = philox4x32(offset + i / 4, 1, seed);  // counter_hi = 1: a stream apart from rand's
    uint32_t a = r.x[(i % 2) * 2], b = r.x[(i % 2) * 2 + 1];
    double u1 = (static_cast<double>(a >> 8) + 1.0) / 16777217.0;  // (0, 1]: log is finite
    double u2 = static_cast<double>(b >> 8) / 16777216.0;
    double radius = std::sqrt(-2.0 * std::log(u1));
    double angle = 2.0 * M_PI * u2;
    double z = (i % 4) < 2 ? radius * std::cos(angle) : radius * std::sin(angle);
    return mean + std * z;
  });
}

Tensor randint(int64_t low, int64_t high, const Shape& shape, DType dtype, Generator* gen) {
  PRECIS_CHECK(high > low, "randint: high (", high, ") must be greater than low (", low, ")");
  uint64_t range = static_cast<uint64_t>(high - low);
  return draw(shape, dtype, gen, [=](uint64_t seed, uint64_t offset, uint64_t i) {
    uint64_t bits = philox_word(seed, offset, i);
    return static_cast<double>(low + static_cast<int64_t>((bits * range) >> 32));
  });
}

}  // namespace precis
