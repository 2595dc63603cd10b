// Row reductions on the GPU: each of `outer` dense rows of `inner` values is
// reduced to one output, as the CPU reduces ops/cpu/reduce_rows' [outer, inner].
//
// The reduction itself is a Reducer, a small struct that owns its pointers:
//   using Acc;                                               a trivially copyable partial result
//   Acc identity() const;                                    the result of no values
//   Acc accumulate(Acc acc, int64_t row, int64_t j) const;   folds in value j of `row`
//   Acc combine(Acc earlier, Acc later) const;               merges two partial results
//   void finish(int64_t row, Acc acc) const;                 writes the row's result
// combine must be associative; the order of the tree below depends only on the
// shape, so every result is the same from run to run.
//
// Two kernels. Many short rows: a group of G lanes (G a power of two up to 32)
// per row, reduced with warp shuffles. Few long rows: each row is cut into pieces,
// a block of threads reduces each piece, and a second pass of the first kernel
// merges each row's pieces in order.
#pragma once

#include <algorithm>

#include "core/copy.h"
#include "core/cuda/block_reduce.cuh"
#include "core/cuda/launch.cuh"
#include "core/cuda/strided_index.cuh"

namespace precis::ops::cuda {

using namespace precis::cuda;  // the device toolkit (core/cuda/)

// Row `row` = (global thread) / group; its lanes take values lane, lane + group, ...
template <typename R>
__global__ void reduce_rows_kernel(R r, int64_t outer, int64_t inner, int group) {
  precis::cuda::wait_for_previous_grid();
  precis::cuda::allow_next_grid_to_start();
  const int64_t thread = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t row = thread / group;
  const int lane = static_cast<int>(thread % group);
  auto acc = r.identity();
  if (row < outer) {
#pragma unroll 4
    for (int64_t j = lane; j < inner; j += group) acc = r.accumulate(acc, row, j);
  }
  acc = group_reduce(r, acc, group);
  if (row < outer && lane == 0) r.finish(row, acc);
}

// Block b reduces piece b % pieces of row b / pieces, values [piece * piece_len, + piece_len),
// into partial[b]; with one piece per row it finishes the row itself.
template <typename R>
__global__ void reduce_row_pieces_kernel(R r, int64_t inner, int64_t piece_len, int64_t pieces,
                                         typename R::Acc* partial) {
  precis::cuda::wait_for_previous_grid();
  precis::cuda::allow_next_grid_to_start();
  const int64_t row = blockIdx.x / pieces, piece = blockIdx.x % pieces;
  const int64_t begin = piece * piece_len, end = begin + piece_len < inner ? begin + piece_len : inner;
  auto acc = r.identity();
#pragma unroll 4
  for (int64_t j = begin + threadIdx.x; j < end; j += blockDim.x) acc = r.accumulate(acc, row, j);
  acc = block_reduce(r, acc);
  if (threadIdx.x == 0) {
    if (pieces == 1)
      r.finish(row, acc);
    else
      partial[blockIdx.x] = acc;
  }
}

// The second pass: row `row`'s values are its pieces' partial results.
template <typename R>
struct PieceMerger {
  using Acc = typename R::Acc;
  R r;
  const Acc* partial;
  int64_t pieces;

  __device__ Acc identity() const { return r.identity(); }
  __device__ Acc accumulate(Acc acc, int64_t row, int64_t j) const { return r.combine(acc, partial[row * pieces + j]); }
  __device__ Acc combine(Acc earlier, Acc later) const { return r.combine(earlier, later); }
  __device__ void finish(int64_t row, Acc acc) const { r.finish(row, acc); }
};

// The smallest power of two >= n, at most 32: the lanes a row of n values gets.
inline int lanes_for(int64_t n) {
  int group = 1;
  while (group < 32 && group < n) group *= 2;
  return group;
}

// Reduces `outer` rows of `inner` values with `r` on `device`'s compute stream.
template <typename R>
void reduce_rows(const char* op, const R& r, int64_t outer, int64_t inner, Device device) {
  if (outer == 0) return;
  precis::cuda::set_device(device);
  cudaStream_t stream = precis::cuda::compute_stream(device);
  constexpr int kThreads = precis::cuda::kBlockSize;
  const int64_t sms = multiprocessor_count(device);
  const int group = lanes_for(inner);
  // Short rows, or enough rows to fill the GPU with one group each: one pass.
  if (inner <= 1024 || outer * group >= sms * 1024) {
    const int64_t blocks = (outer * group + kThreads - 1) / kThreads;
    precis::cuda::launch(reduce_rows_kernel<R>, static_cast<unsigned>(blocks), kThreads, 0, stream, r, outer, inner,
                         group);
    PRECIS_CUDA_CHECK_LAUNCH(op);
    return;
  }
  // Long rows: about four blocks per multiprocessor, each piece at least 1024 values.
  const int64_t pieces = std::max<int64_t>(1, std::min((inner + 1023) / 1024, (4 * sms + outer - 1) / outer));
  const int64_t piece_len = (inner + pieces - 1) / pieces;
  using Acc = typename R::Acc;
  Tensor partial;
  if (pieces > 1) partial = empty({outer * pieces * static_cast<int64_t>(sizeof(Acc))}, DType::u8, device);
  Acc* partial_data = pieces > 1 ? static_cast<Acc*>(partial.raw_data()) : nullptr;
  precis::cuda::launch(reduce_row_pieces_kernel<R>, static_cast<unsigned>(outer * pieces), kThreads, 0, stream, r,
                       inner, piece_len, pieces, partial_data);
  PRECIS_CUDA_CHECK_LAUNCH(op);
  if (pieces == 1) return;
  const int merge_group = lanes_for(pieces);
  const int64_t blocks = (outer * merge_group + kThreads - 1) / kThreads;
  precis::cuda::launch(reduce_rows_kernel<PieceMerger<R>>, static_cast<unsigned>(blocks), kThreads, 0, stream,
                       PieceMerger<R>{r, partial_data, pieces}, outer, pieces, merge_group);
  PRECIS_CUDA_CHECK_LAUNCH(op);
}

// The index a reduction's backward walks: x together with the reduced statistics
// broadcast back over it (stride 0 along the reduced dims). When more than
// kMaxDims dims survive merging, x is replaced by a dense copy, which merges more.
inline StridedIndex<2> backward_index(Tensor& x, const Shape& broadcast_strides, const char* op) {
  StridedIndex<2> index;
  if (!make_strided_index<2>(x.shape(), {x.strides(), broadcast_strides}, index)) {
    x = dense(x);
    PRECIS_CHECK(make_strided_index<2>(x.shape(), {x.strides(), broadcast_strides}, index), op,
                 ": the CUDA backward handles at most ", kMaxDims, " dims that cannot be merged; got ", describe(x));
  }
  return index;
}

}  // namespace precis::ops::cuda
