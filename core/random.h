// Generator: a Philox seed plus a counter offset. Each draw of n numbers takes
// ceil(n/4) counter blocks and advances the offset, so a draw's numbers depend
// only on (seed, offset) and are identical on the CPU and the GPU.
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace precis {

class Generator {
 public:
  explicit Generator(uint64_t seed = 0) : seed_(seed) {}
  void manual_seed(uint64_t seed) {
    seed_ = seed;
    offset_ = 0;
  }
  uint64_t seed() const { return seed_; }
  uint64_t offset() const { return offset_; }
  void set_offset(uint64_t offset) { offset_ = offset; }
  // Reserves the counter blocks for `n` numbers; returns the offset to draw them from.
  uint64_t reserve(uint64_t n) {
    uint64_t start = offset_;
    offset_ += (n + 3) / 4;
    return start;
  }

 private:
  uint64_t seed_;
  uint64_t offset_ = 0;
};

Generator& default_generator();
void manual_seed(uint64_t seed);

// Uniform in [low, high).
Tensor rand(const Shape& shape, DType dtype = DType::f32, Generator* gen = nullptr, double low = 0.0,
            double high = 1.0);
// Normal(mean, std) by Box-Muller on pairs of uniforms.
Tensor randn(const Shape& shape, DType dtype = DType::f32, Generator* gen = nullptr, double mean = 0.0,
             double std = 1.0);
// Integers uniform in [low, high).
Tensor randint(int64_t low, int64_t high, const Shape& shape, DType dtype = DType::i64, Generator* gen = nullptr);

}  // namespace precis
