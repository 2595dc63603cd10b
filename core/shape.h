// Shape and strides helpers.
#pragma once

#include <cstdint>
#include <ostream>
#include <vector>

namespace precis {

// A list of sizes (or strides). Its own type so that it prints as [2, 3] everywhere.
struct Shape : std::vector<int64_t> {
  using std::vector<int64_t>::vector;
  Shape() = default;
  Shape(const std::vector<int64_t>& sizes) : std::vector<int64_t>(sizes) {}
};

int64_t shape_numel(const Shape& shape);
Shape contiguous_strides(const Shape& shape);
// Wraps a possibly negative dim into [0, ndim); `op` names the caller in the error.
int64_t wrap_dim(int64_t dim, int64_t ndim, const char* op);
// The broadcast of two shapes (numpy rules), or an error naming `op` and both shapes.
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op);

std::ostream& operator<<(std::ostream& out, const Shape& shape);

}  // namespace precis
