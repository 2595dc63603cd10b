// embedding: out[n, :] = weight[idx[n], :] (a gather of rows), and its backward, the
// scatter-add dweight[v, :] = sum over n with idx[n] == v of dout[n, :].
//
// The backward is deterministic, as llm.c's encoder backward, but with the bucketing done
// on the device: the (index, position) pairs are radix-sorted by index (CUB, stable, so a
// run of equal indices lists its positions in increasing order), then the block holding a
// run's first position sums that run's gradient rows in a fixed order and writes the weight
// row once.
// No atomics: the same inputs give the same bits on every run.
#include <cub/device/device_radix_sort.cuh>

#include "core/cuda/convert.cuh"
#include "core/cuda/dispatch.cuh"
#include "core/cuda/launch.cuh"
#include "core/cuda/pack.cuh"
#include "ops/cuda/embedding.h"
#include "ops/cuda/index_check.cuh"

namespace precis::ops::cuda {

using namespace precis::cuda;  // the device toolkit (core/cuda/)

namespace {

// One thread per kPack values of an output row. An index outside [0, rows) is flagged
// (the first by position is reported) and its row is written as zeros, never read.
// Bytes: N * C values read from the weight and written to out, N indices read.
template <int kPack, typename T, typename Index>
__global__ void embedding_forward_kernel(const T* weight, int64_t row_stride, int64_t rows, const Index* indices,
                                         T* out, unsigned long long* bad, int64_t N, int64_t C) {
  precis::cuda::wait_for_previous_grid();
  precis::cuda::allow_next_grid_to_start();
  const int64_t packs_per_row = C / kPack;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= N * packs_per_row) return;
  const int64_t n = i / packs_per_row, c = (i % packs_per_row) * kPack;
  const int64_t v = static_cast<int64_t>(indices[n]);
  Pack<T, kPack> value;
  if (v >= 0 && v < rows) {
    value = load_pack<kPack>(weight + v * row_stride + c);
  } else {
    if (c == 0) flag_bad_position(bad, n);
#pragma unroll
    for (int k = 0; k < kPack; ++k) value.v[k] = convert_to<T>(compute_t<T>(0));
  }
  store_pack<kPack>(out + n * C + c, value);
}

// The sort's input: keys (the indices, as i32) and values (their positions 0..N-1).
template <typename Index>
__global__ void embedding_sort_input_kernel(const Index* indices, int32_t* keys, int32_t* positions, int64_t N) {
  precis::cuda::wait_for_previous_grid();
  precis::cuda::allow_next_grid_to_start();
  const int64_t n = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (n >= N) return;
  keys[n] = static_cast<int32_t>(indices[n]);
  positions[n] = static_cast<int32_t>(n);
}

// Block (x, y) takes the sorted positions [kPositionsPerBlock x, ...) and the 32 * kPack
// columns of group y. Only a run's first position works (the block skips the others): its
// kRowSlices rows of threads each sum every kRowSlices-th gradient row of the run, in run
// order, kRowsInFlight rows at a time (their positions, then their gradient packs, loaded
// together), then one row of threads adds the slices in order and writes the weight row.
// The order of the sums depends on the run alone: the same bits on every run.
// Why so: a GPT-2 batch of 16384 tokens has runs of ~1000 equal tokens (",", newline), and
// a row a round trip (its sorted key, its position, then its gradient, one after the other)
// made that run the kernel's critical path; a block per position launched ~100K blocks,
// most of which only learn they are not a run start.
// dweight must be zero beforehand (rows no index names stay zero), or with `accumulate` hold
// what the sums are added to (a parameter's .grad, written where it lies: GPT-2's tied wte,
// whose lm_head product wrote first): each row's f32 sum plus its old value, rounded once to
// T (a bf16 .grad so holds the rounded sum of the two contributions, as llm.c's).
// Bytes: each gradient row read once, each named weight row written once (and read once
// when accumulating).
constexpr int kRowSlices = 8, kRowsInFlight = 4, kPositionsPerBlock = 4;
template <int kPack, typename T, typename A = compute_t<T>>
__global__ void __launch_bounds__(32 * kRowSlices)
    embedding_backward_kernel(const T* grad, const int32_t* sorted_rows, const int32_t* sorted_positions, T* dweight,
                              int64_t N, int64_t C, bool accumulate) {
  precis::cuda::wait_for_previous_grid();
  precis::cuda::allow_next_grid_to_start();
  __shared__ A slices[kRowSlices][kPack][32];
  const int64_t c = (static_cast<int64_t>(blockIdx.y) * 32 + threadIdx.x) * kPack;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * kPositionsPerBlock;
  for (int64_t s = first; s < first + kPositionsPerBlock && s < N; ++s) {
    const int32_t row = sorted_rows[s];
    if (s > 0 && sorted_rows[s - 1] == row) continue;  // the whole block: not the start of a run
    A sum[kPack] = {};
    if (c < C) {
      // Rows s + y, s + y + kRowSlices, ...; a run's rows are consecutive, so once one is
      // past the run's end the later ones are too.
      for (int64_t base = s + threadIdx.y;; base += kRowSlices * kRowsInFlight) {
        int32_t position[kRowsInFlight];
        bool in_run[kRowsInFlight];
#pragma unroll
        for (int u = 0; u < kRowsInFlight; ++u) {
          const int64_t i = base + u * kRowSlices;
          in_run[u] = i < N && sorted_rows[i] == row;
          position[u] = in_run[u] ? sorted_positions[i] : 0;
        }
        Pack<T, kPack> g[kRowsInFlight];
#pragma unroll
        for (int u = 0; u < kRowsInFlight; ++u)
          if (in_run[u]) g[u] = load_pack<kPack>(grad + static_cast<int64_t>(position[u]) * C + c);
#pragma unroll
        for (int u = 0; u < kRowsInFlight; ++u)
          if (in_run[u])
#pragma unroll
            for (int k = 0; k < kPack; ++k) sum[k] += convert_to<A>(g[u].v[k]);
        if (!in_run[kRowsInFlight - 1]) break;
      }
    }
#pragma unroll
    for (int k = 0; k < kPack; ++k) slices[threadIdx.y][k][threadIdx.x] = sum[k];
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
      T* target = dweight + static_cast<int64_t>(row) * C + c;
      Pack<T, kPack> out;
      if (accumulate) out = load_pack<kPack>(target);
#pragma unroll
      for (int k = 0; k < kPack; ++k) {
        A total = sum[k];
        for (int y = 1; y < kRowSlices; ++y) total += slices[y][k][threadIdx.x];
        out.v[k] = convert_to<T>(accumulate ? convert_to<A>(out.v[k]) + total : total);
      }
      store_pack<kPack>(target, out);
    }
    __syncthreads();  // slices is refilled by the block's next run
  }
}

}  // namespace

BadIndex embedding_forward(const Tensor& weight, const Tensor& indices, const Tensor& out) {
  const char* op = "embedding";
  const int64_t rows = weight.shape()[0], C = weight.shape()[1], N = indices.numel();
  if (N == 0 || C == 0) return {};
  cudaStream_t stream = stream_for(weight);
  Tensor flag = empty({1}, DType::i64, weight.device());
  unsigned long long* bad = bad_position_flag(flag, stream, op);
  const int64_t row_stride = weight.strides()[0];
  dispatch_floating(weight.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    dispatch_index(indices.dtype(), op, [&](auto index_tag) {
      using Index = typename decltype(index_tag)::type;
      const T* wp = static_cast<const T*>(weight.raw_data());
      T* op_ = static_cast<T*>(out.raw_data());
      const Index* ip = static_cast<const Index*>(indices.raw_data());
      constexpr int kWide = Packed128<T>::size;
      auto launch = [&](auto kernel, int pack) {
        const unsigned blocks = precis::cuda::grid_for(N * (C / pack));
        precis::cuda::launch(kernel, blocks, precis::cuda::kBlockSize, 0, stream, wp, row_stride, rows, ip, op_, bad, N,
                             C);
      };
      if (C % kWide == 0 && row_stride % kWide == 0 && aligned16(wp) && aligned16(op_))
        launch(embedding_forward_kernel<kWide, T, Index>, kWide);
      else
        launch(embedding_forward_kernel<1, T, Index>, 1);
    });
  });
  PRECIS_CUDA_CHECK_LAUNCH(op);
  return read_bad_position(bad, indices, stream, op);
}

void embedding_backward(const Tensor& grad_rows, const Tensor& indices, const Tensor& dweight, bool accumulate) {
  const char* op = "embedding backward";
  const int64_t rows = dweight.shape()[0], C = dweight.shape()[1], N = indices.numel();
  PRECIS_CHECK(dweight.dtype() == grad_rows.dtype() && dweight.is_contiguous(), op, ": dweight ", describe(dweight),
               " must be contiguous and of the gradient's dtype ", grad_rows.dtype());
  cudaStream_t stream = stream_for(dweight);
  if (!accumulate) PRECIS_CUDA_CHECK(cudaMemsetAsync(dweight.raw_data(), 0, dweight.nbytes(), stream), op);
  if (N == 0 || C == 0) return;
  PRECIS_CHECK(N <= INT32_MAX && rows <= INT32_MAX, op, ": ", N, " indices into ", rows,
               " rows; the CUDA kernel sorts 32-bit indices and positions");

  // Sort (index, position) by index, over the bits an index in [0, rows) can have.
  Tensor pairs = empty({4, N}, DType::i32, dweight.device());  // keys, positions, sorted keys, sorted positions
  int32_t* keys = static_cast<int32_t*>(pairs.raw_data());
  int32_t* positions = keys + N;
  int32_t* sorted_keys = keys + 2 * N;
  int32_t* sorted_positions = keys + 3 * N;
  dispatch_index(indices.dtype(), op, [&](auto index_tag) {
    using Index = typename decltype(index_tag)::type;
    precis::cuda::launch(embedding_sort_input_kernel<Index>, precis::cuda::grid_for(N), precis::cuda::kBlockSize, 0,
                         stream, static_cast<const Index*>(indices.raw_data()), keys, positions, N);
  });
  PRECIS_CUDA_CHECK_LAUNCH(op);
  int end_bit = 1;
  while (end_bit < 31 && (int64_t{1} << end_bit) < rows) ++end_bit;
  size_t temp_bytes = 0;
  PRECIS_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, keys, sorted_keys, positions, sorted_positions,
                                                    static_cast<int>(N), 0, end_bit, stream),
                    op);
  Tensor temp = empty({static_cast<int64_t>(temp_bytes)}, DType::u8, dweight.device());
  PRECIS_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp.raw_data(), temp_bytes, keys, sorted_keys, positions,
                                                    sorted_positions, static_cast<int>(N), 0, end_bit, stream),
                    op);

  dispatch_floating(dweight.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* gp = static_cast<const T*>(grad_rows.raw_data());
    T* dp = static_cast<T*>(dweight.raw_data());
    constexpr int kWide = Packed128<T>::size;
    auto launch = [&](auto kernel, int pack) {
      const dim3 grid(static_cast<unsigned>((N + kPositionsPerBlock - 1) / kPositionsPerBlock),
                      static_cast<unsigned>((C + 32 * pack - 1) / (32 * pack)));
      precis::cuda::launch(kernel, grid, dim3(32, kRowSlices), 0, stream, gp, sorted_keys, sorted_positions, dp, N, C,
                           accumulate);
    };
    if (C % kWide == 0 && aligned16(gp) && aligned16(dp))
      launch(embedding_backward_kernel<kWide, T>, kWide);
    else
      launch(embedding_backward_kernel<1, T>, 1);
  });
  PRECIS_CUDA_CHECK_LAUNCH(op);
}

}  // namespace precis::ops::cuda
