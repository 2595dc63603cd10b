// How the last two dims of a tensor lie in memory, as a matrix product reads them:
// rows dense (row-major), columns dense (column-major, as in a transposed view), or
// neither (copied first). The CPU products (Eigen maps) and the GPU ones (cuBLASLt
// operands) read the first two in place.
#pragma once

#include "core/tensor.h"

namespace precis::ops {

enum class Layout { row_major, col_major, neither };

inline Layout layout_of(const Tensor& t) {
  int64_t rows = t.shape()[t.dim() - 2], cols = t.shape()[t.dim() - 1];
  int64_t rs = t.strides()[t.dim() - 2], cs = t.strides()[t.dim() - 1];
  if ((cs == 1 || cols == 1) && (rs >= cols || rows == 1)) return Layout::row_major;
  if ((rs == 1 || rows == 1) && (cs >= rows || cols == 1)) return Layout::col_major;
  return Layout::neither;
}

}  // namespace precis::ops
