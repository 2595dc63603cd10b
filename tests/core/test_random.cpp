#include <gtest/gtest.h>

#include <cmath>

#include "core/philox.h"
#include "core/random.h"

using namespace precis;

// Known-answer vectors from the Random123 distribution (kat_vectors, philox4x32 10 rounds).
TEST(Philox, MatchesRandom123KnownAnswers) {
  Philox4 zero = philox4x32(0, 0, 0);
  EXPECT_EQ(zero.x[0], 0x6627e8d5u);
  EXPECT_EQ(zero.x[1], 0xe169c58du);
  EXPECT_EQ(zero.x[2], 0xbc57ac4cu);
  EXPECT_EQ(zero.x[3], 0x9b00dbd8u);

  Philox4 ones = philox4x32(~0ull, ~0ull, ~0ull);
  EXPECT_EQ(ones.x[0], 0x408f276du);
  EXPECT_EQ(ones.x[1], 0x41c83b0eu);
  EXPECT_EQ(ones.x[2], 0xa20bc7c6u);
  EXPECT_EQ(ones.x[3], 0x6d5451fdu);

  // Counter words (lo to hi) 243f6a88 85a308d3 13198a2e 03707344, key a4093822 299f31d0 (digits of pi).
  Philox4 pi = philox4x32(0x85a308d3243f6a88ull, 0x0370734413198a2eull, 0x299f31d0a4093822ull);
  EXPECT_EQ(pi.x[0], 0xd16cfe09u);
  EXPECT_EQ(pi.x[1], 0x94fdccebu);
  EXPECT_EQ(pi.x[2], 0x5001e420u);
  EXPECT_EQ(pi.x[3], 0x24126ea1u);
}

TEST(Random, SameSeedSameNumbersAndOffsetsAdvance) {
  Generator a(42), b(42);
  auto first = rand({1000}, DType::f32, &a).to_vector<float>();
  auto again = rand({1000}, DType::f32, &b).to_vector<float>();
  EXPECT_EQ(first, again);
  auto second = rand({1000}, DType::f32, &a).to_vector<float>();
  EXPECT_NE(first, second);
  EXPECT_EQ(a.offset(), 500u);  // two draws of 1000 numbers, 4 per block
}

TEST(Random, DrawDoesNotDependOnHowItIsSplit) {
  // Element i of a draw is word i of the stream: drawing 8 then 8 equals drawing 16.
  Generator whole(7), parts(7);
  auto all = rand({16}, DType::f64, &whole).to_vector<double>();
  auto first = rand({8}, DType::f64, &parts).to_vector<double>();
  auto second = rand({8}, DType::f64, &parts).to_vector<double>();
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(all[i], first[i]);
    EXPECT_EQ(all[8 + i], second[i]);
  }
}

TEST(Random, MomentsAreRight) {
  Generator gen(1);
  auto u = rand({200000}, DType::f64, &gen).to_vector<double>();
  auto n = randn({200000}, DType::f64, &gen, 2.0, 3.0).to_vector<double>();
  double mu = 0, nm = 0, nv = 0;
  for (double x : u) {
    ASSERT_GE(x, 0.0);
    ASSERT_LT(x, 1.0);
    mu += x;
  }
  for (double x : n) nm += x;
  nm /= n.size();
  for (double x : n) nv += (x - nm) * (x - nm);
  nv /= n.size();
  EXPECT_NEAR(mu / u.size(), 0.5, 0.005);
  EXPECT_NEAR(nm, 2.0, 0.03);
  EXPECT_NEAR(std::sqrt(nv), 3.0, 0.03);
}

TEST(Random, RandintStaysInRangeAndCoversIt) {
  Generator gen(3);
  auto v = randint(-2, 3, {10000}, DType::i64, &gen).to_vector<int64_t>();
  std::vector<int> counts(5, 0);
  for (int64_t x : v) {
    ASSERT_GE(x, -2);
    ASSERT_LT(x, 3);
    counts[x + 2]++;
  }
  for (int c : counts) EXPECT_GT(c, 1800);
}

TEST(Random, BadArgumentsAreErrors) {
  EXPECT_THROW(randint(3, 3, {2}), Error);
  EXPECT_THROW(rand({2}, DType::i32), Error);
}
