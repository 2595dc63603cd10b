// Column sums: out[c] = sum over n of g[n, c], g: [N, C] in T (f32, f16, bf16) with unit
// column stride and any row stride ld. This is linear's bias gradient, db = g^T 1 (g the
// output gradient), the pass that linear_param_backward runs beside the plain dW = g^T x
// product when that beats cuBLASLt's fused BGRADB epilogue (matmul_autotune.h, prefer_fused).
// Accumulated in f32, rounded once to O (T, or f32 for a parameter's f32 .grad); with
// `accumulate`, out[c] = out[c] + the sum, added in f32 and rounded once. Deterministic: no
// atomics, and a summation order fixed by the shape and the GPU (its SM count), so every
// run gives the same bits.
//
// Two stages, as layer norm's parameter gradients (ops/cuda/layer_norm.cu):
//  1. Block (s, k) of a (strips, chunks) grid, bx * by = kThreads threads, sums the rows
//     [k R, (k + 1) R) of chunk k over the bx * W columns of strip s. Thread (x, y) owns W
//     adjacent columns, one W-element pack (16 bytes: 8 f16/bf16 or 4 f32 where every row
//     starts 16-byte aligned; 8, 4 or 2 bytes, or single elements, where the rows allow no
//     more), and adds rows y, y + by, y + 2 by, ... of the chunk in increasing order into
//     W f32 registers, loading kRowsInFlight packs (kRowsInFlight rows) before adding any of
//     them. A warp reads 32 consecutive packs of a row: 512 contiguous bytes. The by sums of
//     each column are then added by a fixed tree in shared memory, and the chunk's sums
//     written as partial row k (f32): partial[k, c].
//  2. out[c] = sum over k of partial[k, c]: kSlices threads per column each add every
//     kSlices-th partial row in order, then one adds the kSlices sums in order and rounds to T.
//     With a single chunk stage 1 writes out itself and stage 2 is skipped.
// Grid: as many chunks as give one full wave of stage-1 blocks (SMs x resident blocks per
// SM, about 132 x 4 on an H100: 1024 threads per SM, each with kRowsInFlight 16-byte loads
// in flight, ~128 KiB per SM), but at least kMinRowsPerThread rows per thread.
//
// Bytes: N C sizeof(T) read once; chunks C 4 of partials written and read back (mostly in
// L2); C sizeof(T) written. GPT-2 124M, bf16, N = 16384 on an H100 (528 resident blocks):
//   out = 768:  25.2 MB read,  3 strips x 171 chunks of 96 rows (12 a thread), 0.53 MB of partials (2.1%)
//   out = 2304: 75.5 MB read,  9 strips x 57 chunks of 288 rows (36 a thread), 0.53 MB (0.7%)
//   out = 3072: 100.7 MB read, 12 strips x 44 chunks of 376 rows (47 a thread), 0.54 MB (0.5%)
// A layer's four sums (2304, 768, 3072, 768) read 226 MB, twelve layers 2.72 GB.
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "core/copy.h"
#include "core/cuda/convert.cuh"
#include "core/cuda/dispatch.cuh"
#include "core/cuda/launch.cuh"
#include "core/cuda/pack.cuh"
#include "ops/cuda/column_sums.h"
#include "ops/cuda/reduce.cuh"

namespace precis::ops::cuda {

using namespace precis::cuda;  // the device toolkit (core/cuda/)

namespace {

constexpr int kThreads = 256;         // per stage-1 block
constexpr int kMinBlocksPerSm = 4;    // __launch_bounds__: at most 64 registers a thread
constexpr int kRowsInFlight = 8;      // packs each thread loads before adding them
constexpr int kMinRowsPerThread = 4;  // a chunk has >= 4 by rows: partials <= 1/(4 by) of the rows read
constexpr int kSlices = 16;           // stage-2 threads per column

// The sum of a column, stored to out (added to it with `accumulate`).
template <typename O>
__device__ __forceinline__ void store_sum(O* out, float sum, bool accumulate) {
  *out = convert_to<O>(accumulate ? convert_to<float>(*out) + sum : sum);
}

// Stage 1 (see the top of the file). rows_per_chunk is a multiple of blockDim.y. With
// gridDim.y == 1 the sums go to out (rounded to O), else to partial[blockIdx.y, :].
template <typename T, int W, typename O>
__global__ void __launch_bounds__(kThreads, kMinBlocksPerSm)
    column_sums_partial_kernel(const T* __restrict__ g, int64_t ld, int64_t rows, int64_t cols, int64_t rows_per_chunk,
                               float* __restrict__ partial, O* __restrict__ out, bool accumulate) {
  precis::cuda::wait_for_previous_grid();
  precis::cuda::allow_next_grid_to_start();
  __shared__ float sums[kThreads * W];  // [by][W][bx]
  const int tx = threadIdx.x, ty = threadIdx.y, bx = blockDim.x, by = blockDim.y;
  const int64_t col = (static_cast<int64_t>(blockIdx.x) * bx + tx) * W;
  const int64_t first = static_cast<int64_t>(blockIdx.y) * rows_per_chunk;
  const int64_t last = first + rows_per_chunk < rows ? first + rows_per_chunk : rows;
  float acc[W];
#pragma unroll
  for (int k = 0; k < W; ++k) acc[k] = 0.0f;

  if (col + W <= cols) {
    const T* p = g + col;
    // kRowsInFlight rows at a time, every load issued before the first add. Past the chunk's
    // last row a load repeats that row (unconditional loads, no branch between them; the
    // repeats hit in cache) and its values are not added.
    for (int64_t row = first + ty; row < last; row += kRowsInFlight * by) {
      Pack<T, W> v[kRowsInFlight];
#pragma unroll
      for (int u = 0; u < kRowsInFlight; ++u) {
        const int64_t r = u == 0 || row + u * by < last ? row + u * by : last - 1;
        v[u] = load_pack<W>(p + r * ld);
      }
#pragma unroll
      for (int u = 0; u < kRowsInFlight; ++u) {
        if (u == 0 || row + u * by < last) {  // row itself is < last
#pragma unroll
          for (int k = 0; k < W; ++k) acc[k] += convert_to<float>(v[u].v[k]);
        }
      }
    }
  } else if (col < cols) {
    // The row's last pack, cut short by cols: element by element.
#pragma unroll 4
    for (int64_t row = first + ty; row < last; row += by) {
#pragma unroll
      for (int k = 0; k < W; ++k) {
        if (col + k < cols) acc[k] += convert_to<float>(g[row * ld + col + k]);
      }
    }
  }

  // The by sums of each column, by a fixed tree: at each level row y < s adds row y + s.
  if (by > 1) {
#pragma unroll
    for (int k = 0; k < W; ++k) sums[(ty * W + k) * bx + tx] = acc[k];
    for (int s = by / 2; s > 0; s /= 2) {
      __syncthreads();
      if (ty < s) {
#pragma unroll
        for (int k = 0; k < W; ++k) {
          acc[k] += sums[((ty + s) * W + k) * bx + tx];
          sums[(ty * W + k) * bx + tx] = acc[k];
        }
      }
    }
  }
  if (ty != 0) return;
#pragma unroll
  for (int k = 0; k < W; ++k) {
    if (col + k >= cols) break;
    if (out)
      store_sum(out + col + k, acc[k], accumulate);
    else
      partial[static_cast<int64_t>(blockIdx.y) * cols + col + k] = acc[k];
  }
}

// Stage 2: out[c] = sum over k < chunks of partial[k, c]. A block of (32, kSlices) covers 32
// columns; thread (x, y) adds partial rows y, y + kSlices, ... in order, then thread (x, 0)
// adds the kSlices sums in order.
template <typename O>
__global__ void __launch_bounds__(32 * kSlices)
    column_sums_finish_kernel(const float* __restrict__ partial, O* __restrict__ out, int64_t chunks, int64_t cols,
                              bool accumulate) {
  precis::cuda::wait_for_previous_grid();
  precis::cuda::allow_next_grid_to_start();
  __shared__ float slices[kSlices][33];
  const int64_t col = static_cast<int64_t>(blockIdx.x) * 32 + threadIdx.x;
  float sum = 0.0f;
  if (col < cols) {
#pragma unroll 4
    for (int64_t k = threadIdx.y; k < chunks; k += kSlices) sum += partial[k * cols + col];
  }
  slices[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y == 0 && col < cols) {
#pragma unroll
    for (int s = 1; s < kSlices; ++s) sum += slices[s][threadIdx.x];
    store_sum(out + col, sum, accumulate);
  }
}

template <typename T, int W, typename O>
void launch_column_sums(const T* g, int64_t ld, int64_t rows, int64_t cols, O* out, bool accumulate, Device device,
                        cudaStream_t stream) {
  const int64_t packs = (cols + W - 1) / W;  // per row
  int bx = 1;
  while (bx < 32 && bx < packs) bx *= 2;
  const int by = kThreads / bx;
  const int64_t strips = (packs + bx - 1) / bx;
  // At most one full wave of blocks (all resident at once: no tail of a second wave),
  // kMinRowsPerThread rows a thread at least, at most 65535 chunks.
  const int64_t wave = static_cast<int64_t>(multiprocessor_count(device)) *
                       precis::cuda::resident_blocks_per_sm(
                           reinterpret_cast<const void*>(column_sums_partial_kernel<T, W, O>), kThreads);
  const int64_t wanted = std::max<int64_t>(1, wave / strips);
  int64_t rows_per_chunk = std::max<int64_t>(
      {(rows + wanted - 1) / wanted, static_cast<int64_t>(by) * kMinRowsPerThread, (rows + 65534) / 65535});
  rows_per_chunk = (rows_per_chunk + by - 1) / by * by;
  const int64_t chunks = (rows + rows_per_chunk - 1) / rows_per_chunk;
  PRECIS_CHECK(strips <= INT32_MAX, "column_sums: ", cols, " columns are more than one launch takes");
  const dim3 grid(static_cast<unsigned>(strips), static_cast<unsigned>(chunks)), block(bx, by);
  if (chunks == 1) {
    precis::cuda::launch(column_sums_partial_kernel<T, W, O>, grid, block, 0, stream, g, ld, rows, cols, rows_per_chunk,
                         nullptr, out, accumulate);
    PRECIS_CUDA_CHECK_LAUNCH("column_sums");
    return;
  }
  Tensor partial = empty({chunks, cols}, DType::f32, device);
  float* partial_data = data_of<float>(partial);
  precis::cuda::launch(column_sums_partial_kernel<T, W, O>, grid, block, 0, stream, g, ld, rows, cols, rows_per_chunk,
                       partial_data, nullptr, accumulate);
  PRECIS_CUDA_CHECK_LAUNCH("column_sums");
  precis::cuda::launch(column_sums_finish_kernel<O>, static_cast<unsigned>((cols + 31) / 32), dim3(32, kSlices), 0,
                       stream, partial_data, out, chunks, cols, accumulate);
  PRECIS_CUDA_CHECK_LAUNCH("column_sums");
}

}  // namespace

void column_sums(const Tensor& out, const Tensor& g_in, bool accumulate) {
  const char* op = "column_sums";
  PRECIS_CHECK(g_in.defined() && out.defined(), op, ": undefined operand");
  PRECIS_CHECK(g_in.is_cuda() && g_in.dim() == 2, op, ": expected a 2-D CUDA tensor, got ", describe(g_in));
  const DType dtype = g_in.dtype();
  PRECIS_CHECK(dtype == DType::f32 || dtype == DType::f16 || dtype == DType::bf16, op,
               ": takes float32, float16 or bfloat16, got ", describe(g_in));
  const int64_t rows = g_in.shape()[0], cols = g_in.shape()[1];
  PRECIS_CHECK(out.device() == g_in.device() && (out.dtype() == dtype || out.dtype() == DType::f32) &&
                   out.shape() == Shape({cols}) && out.is_contiguous(),
               op, ": out ", describe(out), " must be contiguous [", cols, "] on the device of ", describe(g_in),
               ", in its dtype or float32");
  if (cols == 0) return;
  if (rows == 0) {
    if (!accumulate) fill_(out, 0.0);
    return;
  }
  // Rows with unit column stride are read in place; anything else (columns dense, as in a
  // transposed view, or neither) is copied to dense rows first.
  const Tensor g = (g_in.strides()[1] == 1 || cols == 1) ? g_in : g_in.detach().contiguous();
  const int64_t ld = rows == 1 ? 0 : g.strides()[0];
  cudaStream_t stream = stream_for(out);
  dispatch_floating(dtype, op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (std::is_same_v<T, double>) {
      PRECIS_FAIL(op, ": no float64 kernel");
    } else {
      const T* data = data_of<const T>(g);
      // The widest pack (at most 16 bytes) at which every row starts on a pack boundary.
      const auto fits = [&](int w) { return reinterpret_cast<uintptr_t>(data) % (w * sizeof(T)) == 0 && ld % w == 0; };
      constexpr int kWide = static_cast<int>(16 / sizeof(T));
      auto launch = [&](auto* out_data) {
        using O = std::remove_pointer_t<decltype(out_data)>;
        if (fits(kWide)) {
          launch_column_sums<T, kWide, O>(data, ld, rows, cols, out_data, accumulate, out.device(), stream);
        } else if (fits(kWide / 2)) {
          launch_column_sums<T, kWide / 2, O>(data, ld, rows, cols, out_data, accumulate, out.device(), stream);
        } else if constexpr (kWide >= 8) {
          if (fits(2))
            launch_column_sums<T, 2, O>(data, ld, rows, cols, out_data, accumulate, out.device(), stream);
          else
            launch_column_sums<T, 1, O>(data, ld, rows, cols, out_data, accumulate, out.device(), stream);
        } else {
          launch_column_sums<T, 1, O>(data, ld, rows, cols, out_data, accumulate, out.device(), stream);
        }
      };
      if constexpr (std::is_same_v<T, float>) {
        launch(data_of<float>(out));
      } else if (out.dtype() == DType::f32) {
        launch(data_of<float>(out));
      } else {
        launch(data_of<T>(out));
      }
    }
  });
}

}  // namespace precis::ops::cuda
