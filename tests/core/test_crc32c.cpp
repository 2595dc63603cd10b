#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/crc32c.h"

using precis::crc32c;

// The check values of the CRC catalogue (reveng.sourceforge.io/crc-catalogue, CRC-32/ISCSI)
// and RFC 3720's test patterns (B.4).
TEST(Crc32c, MatchesThePublishedCheckValues) {
  const std::string digits = "123456789";
  EXPECT_EQ(crc32c(digits.data(), digits.size()), 0xE3069283u);
  std::vector<unsigned char> zeros(32, 0), ones(32, 0xFF), ascending(32);
  for (int i = 0; i < 32; ++i) ascending[i] = static_cast<unsigned char>(i);
  EXPECT_EQ(crc32c(zeros.data(), 32), 0x8A9136AAu);
  EXPECT_EQ(crc32c(ones.data(), 32), 0x62A8AB43u);
  EXPECT_EQ(crc32c(ascending.data(), 32), 0x46DD794Eu);
  EXPECT_EQ(crc32c(nullptr, 0), 0u);
}

// Continuing from a prefix's value gives the whole buffer's, at every split (the 8-byte
// loop and the byte tail agree), and a single flipped bit changes it.
TEST(Crc32c, ContinuesAcrossSplitsAndSeesOneFlippedBit) {
  std::vector<unsigned char> bytes(37);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<unsigned char>(i * 37 + 11);
  const uint32_t whole = crc32c(bytes.data(), bytes.size());
  for (size_t split = 0; split <= bytes.size(); ++split)
    EXPECT_EQ(crc32c(bytes.data() + split, bytes.size() - split, crc32c(bytes.data(), split)), whole) << split;
  for (size_t bit = 0; bit < bytes.size() * 8; ++bit) {
    std::vector<unsigned char> flipped = bytes;
    flipped[bit / 8] ^= static_cast<unsigned char>(1u << (bit % 8));
    EXPECT_NE(crc32c(flipped.data(), flipped.size()), whole) << bit;
  }
}
