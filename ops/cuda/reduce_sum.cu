// sum over any dims, accumulated in f32 (f64 for f64, i64 for integers).
//
// A contiguous x whose reduced dims form one block is [A, R, B] (A kept dims before
// the block, R reduced values, B kept after):
//   out[a, b] = sum_r x[a, r, b]
// B == 1 (reducing the innermost dims: losses, means over features) is a row
// reduction, ops/cuda/reduce.cuh. B > 1 (reducing leading dims: bias gradients,
// sum_to_shape after broadcasting) is a column reduction: a warp reads 32
// consecutive b of one r (coalesced), 8 warps of a block take every 8th r, and
// long columns are cut into pieces whose partial sums a second pass adds up.
// Any other layout is first copied to dense rows with the reduced dims last.
#include <algorithm>

#include "core/copy.h"
#include "core/cuda/convert.cuh"
#include "core/cuda/dispatch.cuh"
#include "core/cuda/launch.cuh"
#include "ops/cuda/reduce.cuh"
#include "ops/cuda/reduce.h"

namespace precis::ops::cuda {

using namespace precis::cuda;  // the device toolkit (core/cuda/)

namespace {

// The accumulator of a sum of T: f32 for the floats up to f32, f64 for f64, i64 for integers.
template <typename T>
using sum_acc_t =
    std::conditional_t<std::is_same_v<T, double>, double, std::conditional_t<std::is_integral_v<T>, int64_t, float>>;

template <typename In, typename Out>
struct SumRows {
  using Acc = sum_acc_t<In>;
  const In* x;
  Out* out;
  int64_t inner;

  __device__ Acc identity() const { return Acc(0); }
  __device__ Acc accumulate(Acc acc, int64_t row, int64_t j) const { return acc + convert_to<Acc>(x[row * inner + j]); }
  __device__ Acc combine(Acc earlier, Acc later) const { return earlier + later; }
  __device__ void finish(int64_t row, Acc acc) const { out[row] = convert_to<Out>(acc); }
};

constexpr int kColumnLanes = 32;  // b per block (one warp wide)
constexpr int kColumnWarps = 8;   // r in flight per block

// Block (x, y) of the grid: x = a * b_tiles + tile of 32 b, y = piece of rows_per_piece r.
// out[(piece * A + a) * B + b] = sum of x[a, r, b] over the piece's r.
template <typename In, typename Acc, typename Out>
__global__ void sum_columns_kernel(const In* x, Out* out, int64_t A, int64_t R, int64_t B, int64_t rows_per_piece,
                                   int64_t b_tiles) {
  precis::cuda::wait_for_previous_grid();
  precis::cuda::allow_next_grid_to_start();
  __shared__ Acc partial[kColumnWarps][kColumnLanes + 1];
  const int64_t a = blockIdx.x / b_tiles;
  const int64_t b = (blockIdx.x % b_tiles) * kColumnLanes + threadIdx.x;
  const int64_t piece = blockIdx.y;
  const int64_t begin = piece * rows_per_piece;
  const int64_t end = begin + rows_per_piece < R ? begin + rows_per_piece : R;
  Acc acc = 0;
  if (b < B) {
    const In* column = x + a * R * B + b;
#pragma unroll 4
    for (int64_t r = begin + threadIdx.y; r < end; r += kColumnWarps) acc += convert_to<Acc>(column[r * B]);
  }
  partial[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && b < B) {
    Acc total = 0;
#pragma unroll
    for (int w = 0; w < kColumnWarps; ++w) total += partial[w][threadIdx.x];
    out[(piece * A + a) * B + b] = convert_to<Out>(total);
  }
}

template <typename In, typename Acc, typename Out>
void launch_columns(const In* x, Out* out, int64_t A, int64_t R, int64_t B, int64_t rows_per_piece,
                    cudaStream_t stream) {
  const int64_t b_tiles = (B + kColumnLanes - 1) / kColumnLanes;
  const int64_t pieces = (R + rows_per_piece - 1) / rows_per_piece;
  dim3 grid(static_cast<unsigned>(A * b_tiles), static_cast<unsigned>(pieces));
  precis::cuda::launch(sum_columns_kernel<In, Acc, Out>, grid, dim3(kColumnLanes, kColumnWarps), 0, stream, x, out, A,
                       R, B, rows_per_piece, b_tiles);
  PRECIS_CUDA_CHECK_LAUNCH("sum");
}

// out[a, b] = sum_r x[a, r, b] for a dense x.
template <typename T>
void sum_columns(const Tensor& x, const Tensor& out, int64_t A, int64_t R, int64_t B) {
  using Acc = sum_acc_t<T>;
  cudaStream_t stream = stream_for(out);
  const int64_t b_tiles = (B + kColumnLanes - 1) / kColumnLanes;
  // About four blocks per multiprocessor, each piece at least 64 r (8 per warp).
  const int64_t wanted = 4 * multiprocessor_count(out.device());
  const int64_t pieces =
      std::clamp<int64_t>((wanted + A * b_tiles - 1) / (A * b_tiles), 1, std::min<int64_t>((R + 63) / 64, 65535));
  const int64_t rows_per_piece = (R + pieces - 1) / pieces;
  if (rows_per_piece >= R) {
    launch_columns<T, Acc, T>(data_of<const T>(x), data_of<T>(out), A, R, B, R, stream);
    return;
  }
  const int64_t used_pieces = (R + rows_per_piece - 1) / rows_per_piece;
  Tensor partial = empty({used_pieces * A * B * static_cast<int64_t>(sizeof(Acc))}, DType::u8, out.device());
  Acc* partial_data = static_cast<Acc*>(partial.raw_data());
  launch_columns<T, Acc, Acc>(data_of<const T>(x), partial_data, A, R, B, rows_per_piece, stream);
  // The partial sums are [pieces, A * B]: a column reduction of their own, in one piece.
  launch_columns<Acc, Acc, T>(partial_data, data_of<T>(out), 1, used_pieces, A * B, used_pieces, stream);
}

}  // namespace

Tensor sum(const Tensor& x, const std::vector<bool>& reduced) {
  PRECIS_CHECK(static_cast<int64_t>(reduced.size()) == x.dim(), "sum: ", reduced.size(), " reduction flags for ",
               describe(x));
  int64_t outer = 1;
  for (int64_t d = 0; d < x.dim(); ++d)
    if (!reduced[d]) outer *= x.shape()[d];
  Tensor out = empty({outer}, x.dtype(), x.device());
  if (outer == 0) return out;
  if (x.numel() == 0) {
    fill_(out, 0.0);
    return out;
  }
  // [A, R, B] when x is dense and the reduced dims (of size > 1) form one block.
  int64_t A = 1, R = 1, B = 1;
  bool one_block = x.is_contiguous();
  int seen = 0;  // 0: before the reduced block, 1: in it, 2: after it
  for (int64_t d = 0; d < x.dim() && one_block; ++d) {
    const int64_t size = x.shape()[d];
    if (size == 1) continue;
    if (reduced[d]) {
      one_block = seen < 2;
      seen = 1;
      R *= size;
    } else if (seen == 0) {
      A *= size;
    } else {
      seen = 2;
      B *= size;
    }
  }
  dispatch_numeric(x.dtype(), "sum", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (one_block && B == 1) {
      reduce_rows("sum", SumRows<T, T>{data_of<const T>(x), data_of<T>(out), R}, A, R, x.device());
    } else if (one_block && B >= 16) {
      sum_columns<T>(x, out, A, R, B);
    } else {
      // Kept dims first, reduced dims last, copied dense: [outer, inner] rows.
      Shape shape, strides;
      for (int pass = 0; pass < 2; ++pass)
        for (int64_t d = 0; d < x.dim(); ++d)
          if (reduced[d] == (pass == 1)) {
            shape.push_back(x.shape()[d]);
            strides.push_back(x.strides()[d]);
          }
      Tensor rows = dense(x.as_strided(shape, strides, x.offset()));
      const int64_t inner = x.numel() / outer;
      reduce_rows("sum", SumRows<T, T>{data_of<const T>(rows), data_of<T>(out), inner}, outer, inner, x.device());
    }
  });
  return out;
}

}  // namespace precis::ops::cuda
