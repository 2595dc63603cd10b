// The inputs of the collective tests, which every rank can compute for any rank,
// and their reductions. Small integers (and, for avg over 2 or 4 ranks, halves and
// quarters of them): exact in every dtype, whatever order a backend sums in.
#pragma once

#include <vector>

#include "distributed/process_group.h"

namespace precis::testing {

// Rank r's input: element i is (r + 1) * (i % 5 + 1) - 3 * (i % 2).
inline double input_value(int rank, int64_t i) { return (rank + 1) * (i % 5 + 1) - 3.0 * (i % 2); }

inline std::vector<double> input_values(int rank, int64_t n) {
  std::vector<double> values(n);
  for (int64_t i = 0; i < n; ++i) values[i] = input_value(rank, i);
  return values;
}

inline Tensor input_tensor(DType dtype, int rank, int64_t n, Device device = Device::cpu()) {
  return from_vector<double>(input_values(rank, n), {n}).to(dtype).to(device);
}

// Sum (or avg) over ranks of input_value, per element.
inline std::vector<double> reduced_values(int64_t n, distributed::ReduceOp op, int world_size) {
  std::vector<double> out(n, 0.0);
  for (int r = 0; r < world_size; ++r)
    for (int64_t i = 0; i < n; ++i) out[i] += input_value(r, i);
  if (op == distributed::ReduceOp::avg)
    for (double& v : out) v /= world_size;
  return out;
}

}  // namespace precis::testing
