// Reductions on the CPU are done on rows: the reduced dims are moved to the end
// and the tensor is made contiguous as [outer, inner], so each output element is
// the reduction of one dense row of `inner` values.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/copy.h"
#include "core/strided_loop.h"
#include "core/tensor.h"

namespace precis::ops::cpu {

struct ReductionRows {
  Tensor rows;                // contiguous [outer, inner]
  int64_t outer = 1;          // number of output elements
  int64_t inner = 1;          // values reduced into each
  Shape out_shape;            // result shape without keepdim
  Shape keepdim_shape;        // result shape with the reduced dims kept as size 1
  std::vector<bool> reduced;  // per input dim
};

// `dims` empty means every dim. Each dim is wrapped and checked (errors name `op`).
ReductionRows reduction_rows(const Tensor& x, const std::vector<int64_t>& dims, const char* op);

// Reduces each row of a dense [outer, inner] layout: piece(row, begin, end) -> Acc for
// pieces of at most kParallelGrain values, folded in order with combine(earlier, later),
// then finish(row, Acc). Long rows are cut into pieces so that a full reduction still uses
// every core; the pieces depend only on the shape, so results do not depend on the threads.
template <typename Acc, typename PieceFn, typename CombineFn, typename FinishFn>
void reduce_rows_in_pieces(int64_t outer, int64_t inner, PieceFn piece, CombineFn combine, FinishFn finish) {
  const bool parallel = outer * inner >= kParallelGrain;
  if (inner <= kParallelGrain) {
#pragma omp parallel for schedule(static) if (parallel && outer > 1)
    for (int64_t row = 0; row < outer; ++row) finish(row, piece(row, 0, inner));
    return;
  }
  const int64_t per_row = (inner + kParallelGrain - 1) / kParallelGrain;
  std::vector<Acc> partial(outer * per_row);
#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t task = 0; task < outer * per_row; ++task) {
    int64_t begin = (task % per_row) * kParallelGrain;
    partial[task] = piece(task / per_row, begin, std::min(inner, begin + kParallelGrain));
  }
  for (int64_t row = 0; row < outer; ++row) {
    Acc acc = partial[row * per_row];
    for (int64_t p = 1; p < per_row; ++p) acc = combine(acc, partial[row * per_row + p]);
    finish(row, acc);
  }
}

}  // namespace precis::ops::cpu
