// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11):
// a counter-based generator. The numbers depend only on (seed, counter), so the
// CPU and a CUDA kernel produce the same stream for the same seed and offset,
// in any order and on any number of threads. This header compiles for both.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define PRECIS_HOST_DEVICE __host__ __device__
#else
#define PRECIS_HOST_DEVICE
#endif

namespace precis {

struct Philox4 {
  uint32_t x[4];
};

// Ten rounds of the Philox bijection of a 128-bit counter under a 64-bit key.
PRECIS_HOST_DEVICE inline Philox4 philox4x32(uint64_t counter_lo, uint64_t counter_hi, uint64_t seed) {
  constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
  constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
  uint32_t c0 = static_cast<uint32_t>(counter_lo), c1 = static_cast<uint32_t>(counter_lo >> 32);
  uint32_t c2 = static_cast<uint32_t>(counter_hi), c3 = static_cast<uint32_t>(counter_hi >> 32);
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  for (int round = 0; round < 10; ++round) {
    uint64_t p0 = static_cast<uint64_t>(kMul0) * c0;
    uint64_t p1 = static_cast<uint64_t>(kMul1) * c2;
    uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
    k0 += kWeyl0;
    k1 += kWeyl1;
  }
  return {{c0, c1, c2, c3}};
}

// A uniform float in [0, 1) from the top 24 bits of a random word.
PRECIS_HOST_DEVICE inline float uniform_from_bits(uint32_t bits) {
  return static_cast<float>(bits >> 8) * (1.0f / 16777216.0f);
}

// Element i of a draw starting at `offset` uses word i % 4 of block (offset + i / 4).
PRECIS_HOST_DEVICE inline uint32_t philox_word(uint64_t seed, uint64_t offset, uint64_t i) {
  return philox4x32(offset + i / 4, 0, seed).x[i % 4];
}

}  // namespace precis
