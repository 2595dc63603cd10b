// Comparing the per-step losses of two runs of the same training (a CPU and a GPU run).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace precis::testing {

// The largest relative difference between the runs' losses, step by step; both must have
// `steps` losses, and `other`'s must all be finite.
inline double largest_relative_difference(const std::vector<double>& reference, const std::vector<double>& other,
                                          size_t steps) {
  EXPECT_EQ(reference.size(), steps);
  EXPECT_EQ(other.size(), reference.size());
  double largest = 0;
  for (size_t i = 0; i < std::min(reference.size(), other.size()); ++i) {
    EXPECT_TRUE(std::isfinite(other[i])) << "step " << i + 1;
    largest = std::max(largest, std::abs(other[i] - reference[i]) / std::abs(reference[i]));
  }
  return largest;
}

}  // namespace precis::testing
