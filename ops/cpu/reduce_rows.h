// Reductions on the CPU are done on rows: the reduced dims are moved to the end
// and the tensor is made contiguous as [outer, inner], so each output element is
// the reduction of one dense row of `inner` values.
#pragma once

#include <vector>

#include "core/copy.h"
#include "core/tensor.h"

namespace precis::ops::cpu {

struct ReductionRows {
  Tensor rows;          // contiguous [outer, inner]
  int64_t outer = 1;    // number of output elements
  int64_t inner = 1;    // values reduced into each
  Shape out_shape;      // result shape without keepdim
  Shape keepdim_shape;  // result shape with the reduced dims kept as size 1
  std::vector<bool> reduced;  // per input dim
};

// `dims` empty means every dim. Each dim is wrapped and checked (errors name `op`).
ReductionRows reduction_rows(const Tensor& x, const std::vector<int64_t>& dims, const char* op);

}  // namespace precis::ops::cpu
