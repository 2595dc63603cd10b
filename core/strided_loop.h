// for_each_row: the loop every strided CPU kernel is built on.
//
// A tensor of shape [d0, ..., dn] is walked as rows along its last dim. For each
// row, fn(base_offsets, count, inner_strides) gets the element offset of the
// row's first element in every operand; the caller loops `count` elements with
// the inner strides. Adjacent dims that are contiguous in every operand are
// merged first, so a dense tensor is one long row (which the caller's loop can
// vectorise). Rows, and pieces of long rows, run in parallel under OpenMP.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>

#include "core/shape.h"

namespace precis {

inline constexpr int64_t kParallelGrain = 32768;  // elements below which we stay on one thread

template <size_t N>
struct RowLoop {
  Shape shape;
  std::array<Shape, N> strides;

  // Merges dim d into d+1 wherever every operand has stride[d] == stride[d+1] * shape[d+1].
  RowLoop(const Shape& shape_in, const std::array<Shape, N>& strides_in) {
    for (size_t d = 0; d < shape_in.size(); ++d) {
      if (shape_in[d] == 1) continue;  // size-1 dims move nothing
      bool merge = !shape.empty();
      for (size_t k = 0; k < N && merge; ++k) merge = strides[k].back() == strides_in[k][d] * shape_in[d];
      if (merge) {
        shape.back() *= shape_in[d];
        for (size_t k = 0; k < N; ++k) strides[k].back() = strides_in[k][d];
      } else {
        shape.push_back(shape_in[d]);
        for (size_t k = 0; k < N; ++k) strides[k].push_back(strides_in[k][d]);
      }
    }
  }
};

template <size_t N, typename Fn>
void for_each_row(const Shape& shape_in, const std::array<Shape, N>& strides_in, Fn&& fn) {
  if (shape_numel(shape_in) == 0) return;
  RowLoop<N> loop(shape_in, strides_in);
  const Shape& shape = loop.shape;
  const int64_t ndim = static_cast<int64_t>(shape.size());
  const int64_t count = ndim == 0 ? 1 : shape[ndim - 1];
  std::array<int64_t, N> inner{};
  for (size_t k = 0; k < N; ++k) inner[k] = ndim == 0 ? 0 : loop.strides[k][ndim - 1];
  const int64_t rows = shape_numel(shape) / count;
  // Long rows are cut into pieces so that a single dense row still uses every core.
  const int64_t piece = std::max<int64_t>(count, 1) > kParallelGrain && rows < 64 ? kParallelGrain : count;
  const int64_t pieces_per_row = (count + piece - 1) / piece;
  const int64_t tasks = rows * pieces_per_row;
  auto run = [&](int64_t task) {
    int64_t row = task / pieces_per_row, start = (task % pieces_per_row) * piece;
    std::array<int64_t, N> base{};
    for (int64_t d = ndim - 2; d >= 0; --d) {
      int64_t i = row % shape[d];
      row /= shape[d];
      for (size_t k = 0; k < N; ++k) base[k] += i * loop.strides[k][d];
    }
    for (size_t k = 0; k < N; ++k) base[k] += start * inner[k];
    fn(base, std::min(piece, count - start), inner);
  };
  if (rows * count < kParallelGrain || tasks == 1) {
    for (int64_t task = 0; task < tasks; ++task) run(task);
    return;
  }
#pragma omp parallel for schedule(static)
  for (int64_t task = 0; task < tasks; ++task) run(task);
}

}  // namespace precis
