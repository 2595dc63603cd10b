// The elementwise map every op of ops/cuda/elementwise_*.cu is built on:
// out[i] = f(in_0[i], ..., in_{N-1}[i]) over N inputs of one element type T,
// computed in compute_t<T> and rounded to T on store.
//
// Three kernels: a dense one moving 16 bytes per operand per thread when every
// operand is contiguous and 16-byte aligned (the common case); a repeated-rows one,
// as fast, where an operand is one contiguous row broadcast over the rows of the
// output (a bias, GPT-2's position embedding added to every sequence); and a strided
// one that finds each operand's element through a StridedIndex (transposes, slices,
// other broadcasting).
#pragma once

#include <array>

#include "core/copy.h"
#include "core/cuda/convert.cuh"
#include "core/cuda/dispatch.cuh"
#include "core/cuda/launch.cuh"
#include "core/cuda/pack.cuh"
#include "core/cuda/strided_index.cuh"
#include "ops/broadcast.h"

namespace precis::ops::cuda {

using namespace precis::cuda;  // the device toolkit (core/cuda/)

template <typename T, int N>
struct Inputs {
  const T* p[N];
};

template <typename F, typename C, int N>
__device__ __forceinline__ C call(const F& f, const C (&v)[N]) {
  static_assert(N == 1 || N == 2, "maps take one or two inputs");
  if constexpr (N == 1)
    return f(v[0]);
  else
    return f(v[0], v[1]);
}

// Thread t handles elements [t * P, t * P + P) with P = 16 / sizeof(T); the last thread
// finishes a tail shorter than a pack one element at a time.
template <typename T, int N, typename F>
__global__ void map_dense_kernel(T* out, Inputs<T, N> in, int64_t n, F f) {
  precis::cuda::wait_for_previous_grid();
  precis::cuda::allow_next_grid_to_start();
  using C = compute_t<T>;
  using Pack = Packed128<T>;
  const int64_t start = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * Pack::size;
  if (start + Pack::size <= n) {
    Pack loaded[N];
#pragma unroll
    for (int k = 0; k < N; ++k) loaded[k] = load_pack<Pack::size>(in.p[k] + start);
    Pack result;
#pragma unroll
    for (int j = 0; j < Pack::size; ++j) {
      C v[N];
#pragma unroll
      for (int k = 0; k < N; ++k) v[k] = convert_to<C>(loaded[k].v[j]);
      result.v[j] = convert_to<T>(call(f, v));
    }
    store_pack<Pack::size>(out + start, result);
  } else {
    for (int64_t i = start; i < n; ++i) {
      C v[N];
#pragma unroll
      for (int k = 0; k < N; ++k) v[k] = convert_to<C>(in.p[k][i]);
      out[i] = convert_to<T>(call(f, v));
    }
  }
}

// The dense kernel over rows of `row` elements, where input k is read at i (dense) or,
// when repeated[k], at i % row (one row broadcast over all of them). `row` is a multiple of
// the pack size, so no pack straddles two rows.
template <int N>
struct Repeated {
  bool row[N];  // input k is one row broadcast over all of them
};

template <typename T, int N, typename F>
__global__ void map_repeated_rows_kernel(T* out, Inputs<T, N> in, Repeated<N> repeated, int64_t row, int64_t n, F f) {
  precis::cuda::wait_for_previous_grid();
  precis::cuda::allow_next_grid_to_start();
  using C = compute_t<T>;
  using Pack = Packed128<T>;
  const int64_t start = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * Pack::size;
  if (start >= n) return;
  const int64_t column = start % row;
  Pack loaded[N];
#pragma unroll
  for (int k = 0; k < N; ++k) loaded[k] = load_pack<Pack::size>(in.p[k] + (repeated.row[k] ? column : start));
  Pack result;
#pragma unroll
  for (int j = 0; j < Pack::size; ++j) {
    C v[N];
#pragma unroll
    for (int k = 0; k < N; ++k) v[k] = convert_to<C>(loaded[k].v[j]);
    result.v[j] = convert_to<T>(call(f, v));
  }
  store_pack<Pack::size>(out + start, result);
}

// One element per thread; `out` is dense, the inputs have any strides.
template <typename T, int N, typename F>
__global__ void map_strided_kernel(T* out, Inputs<T, N> in, StridedIndex<N> index, int64_t n, F f) {
  precis::cuda::wait_for_previous_grid();
  precis::cuda::allow_next_grid_to_start();
  using C = compute_t<T>;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  int64_t off[N];
  index.offsets(i, off);
  C v[N];
#pragma unroll
  for (int k = 0; k < N; ++k) v[k] = convert_to<C>(in.p[k][off[k]]);
  out[i] = convert_to<T>(call(f, v));
}

// ---- host side

// out = f(inputs...) elementwise: `out` is a new dense tensor; the inputs have its shape
// (broadcast views are fine) and element type T.
template <typename T, int N, typename F>
void launch_map(const char* op, const Tensor& out, std::array<Tensor, N> inputs, F f) {
  const int64_t n = out.numel();
  if (n == 0) return;
  cudaStream_t stream = stream_for(out);
  const StridedIndex<N> index = index_over<N>(out.shape(), inputs);
  Inputs<T, N> in;
  bool vectorisable = aligned16(out.raw_data());
  for (int k = 0; k < N; ++k) {
    in.p[k] = data_of<const T>(inputs[k]);
    vectorisable = vectorisable && aligned16(in.p[k]) && index.ndim == 1 && index.strides[k][0] == 1;
  }
  // Two merged dims, the inner contiguous in every operand, the outer dense or repeated.
  Repeated<N> repeated{};
  bool rows = !vectorisable && index.ndim == 2 && index.sizes[0] % Packed128<T>::size == 0 && aligned16(out.raw_data());
  for (int k = 0; k < N && rows; ++k) {
    repeated.row[k] = index.strides[k][1] == 0;
    rows = aligned16(in.p[k]) && index.strides[k][0] == 1 && (repeated.row[k] || index.strides[k][1] == index.sizes[0]);
  }
  if (vectorisable) {
    precis::cuda::launch(map_dense_kernel<T, N, F>, precis::cuda::grid_for(n, Packed128<T>::size),
                         precis::cuda::kBlockSize, 0, stream, data_of<T>(out), in, n, f);
  } else if (rows) {
    precis::cuda::launch(map_repeated_rows_kernel<T, N, F>, precis::cuda::grid_for(n, Packed128<T>::size),
                         precis::cuda::kBlockSize, 0, stream, data_of<T>(out), in, repeated, index.sizes[0], n, f);
  } else {
    precis::cuda::launch(map_strided_kernel<T, N, F>, precis::cuda::grid_for(n), precis::cuda::kBlockSize, 0, stream,
                         data_of<T>(out), in, index, n, f);
  }
  PRECIS_CUDA_CHECK_LAUNCH(op);
}

}  // namespace precis::ops::cuda
