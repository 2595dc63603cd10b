// softmax and log_softmax along the last dim, rows of n values: one warp per row
// when n <= 1024, else one block per row (ops/cuda/row_groups.cuh: dispatch_row_threads).
// Math in f32 (f64 for f64), rounded to the element type on store.
#include "core/cuda/block_reduce.cuh"
#include "core/cuda/convert.cuh"
#include "core/cuda/dispatch.cuh"
#include "core/cuda/launch.cuh"
#include "core/cuda/pack.cuh"
#include "ops/cuda/online_softmax.cuh"
#include "ops/cuda/row_groups.cuh"
#include "ops/cuda/softmax.h"

namespace precis::ops::cuda {

using namespace precis::cuda;  // the device toolkit (core/cuda/)

namespace {

// Forward. Pass 1 folds the row into the online statistics (m, s), m the running max
// and s = sum exp(x - m) rescaled whenever m grows; the threads' (m, s) merge in the
// reduction. Pass 2 writes
//   softmax:     y = exp(x - m) / s
//   log_softmax: y = (x - m) - log s   (not x - (m + log s), which rounds log s away for large m)
// Bytes: x read twice (the second pass mostly from L1/L2), y written once.
template <int kThreads, int kPack, bool kLog, typename T>
__global__ void PRECIS_ROW_LAUNCH_BOUNDS(kThreads) softmax_forward_kernel(const T* x, T* y, int64_t rows, int64_t n) {
  precis::cuda::wait_for_previous_grid();
  precis::cuda::allow_next_grid_to_start();
  using A = compute_t<T>;
  const int64_t row = row_index();
  if (row >= rows) return;
  const T* xr = x + row * n;
  T* yr = y + row * n;
  Pair<A> ms = max_sum_identity<A>();
  for_each_in_row<kPack>(xr, n, threadIdx.x, kThreads, [&](int64_t i, auto width) {
    constexpr int W = decltype(width)::value;
    const Pack<T, W> v = load_pack<W>(xr + i);
#pragma unroll
    for (int k = 0; k < W; ++k) max_sum_add(ms, convert_to<A>(v.v[k]));
  });
  ms = row_all_reduce<kThreads>(ms, MaxSumOp{});
  const A m = ms.first, inv_sum = A(1) / ms.second, log_sum = ::log(ms.second);
  for_each_in_row<kPack>(xr, n, threadIdx.x, kThreads, [&](int64_t i, auto width) {
    constexpr int W = decltype(width)::value;
    const Pack<T, W> v = load_pack<W>(xr + i);
    Pack<T, W> out;
#pragma unroll
    for (int k = 0; k < W; ++k) {
      const A shifted = convert_to<A>(v.v[k]) - m;
      out.v[k] = convert_to<T>(kLog ? shifted - log_sum : ::exp(shifted) * inv_sum);
    }
    store_pack<W>(yr + i, out);
  });
}

// Backward, from the output y and its gradient g:
//   softmax:     dx = y (g - sum g y)
//   log_softmax: dx = g - exp(y) sum g
// Pass 1 reduces the sum, pass 2 writes dx. Bytes: y and g read twice, dx written once.
template <int kThreads, int kPack, bool kLog, typename T>
__global__ void PRECIS_ROW_LAUNCH_BOUNDS(kThreads)
    softmax_backward_kernel(const T* y, const T* g, T* dx, int64_t rows, int64_t n) {
  precis::cuda::wait_for_previous_grid();
  precis::cuda::allow_next_grid_to_start();
  using A = compute_t<T>;
  const int64_t row = row_index();
  if (row >= rows) return;
  const T* yr = y + row * n;
  const T* gr = g + row * n;
  T* dr = dx + row * n;
  A total = 0;
  for_each_in_row<kPack>(yr, n, threadIdx.x, kThreads, [&](int64_t i, auto width) {
    constexpr int W = decltype(width)::value;
    const Pack<T, W> gv = load_pack<W>(gr + i);
    if constexpr (kLog) {
#pragma unroll
      for (int k = 0; k < W; ++k) total += convert_to<A>(gv.v[k]);
    } else {
      const Pack<T, W> yv = load_pack<W>(yr + i);
#pragma unroll
      for (int k = 0; k < W; ++k) total += convert_to<A>(gv.v[k]) * convert_to<A>(yv.v[k]);
    }
  });
  total = row_all_reduce<kThreads>(total, SumOp{});
  for_each_in_row<kPack>(yr, n, threadIdx.x, kThreads, [&](int64_t i, auto width) {
    constexpr int W = decltype(width)::value;
    const Pack<T, W> yv = load_pack<W>(yr + i);
    const Pack<T, W> gv = load_pack<W>(gr + i);
    Pack<T, W> out;
#pragma unroll
    for (int k = 0; k < W; ++k) {
      const A yk = convert_to<A>(yv.v[k]), gk = convert_to<A>(gv.v[k]);
      out.v[k] = convert_to<T>(kLog ? gk - ::exp(yk) * total : yk * (gk - total));
    }
    store_pack<W>(dr + i, out);
  });
}

// Rows of the last dim: (rows, n); a 0-dim tensor is one row of one value.
Pair<int64_t> last_dim_rows(const Tensor& t) {
  const int64_t n = t.dim() == 0 ? 1 : t.shape().back();
  return {n == 0 ? 0 : t.numel() / n, n};
}

}  // namespace

void softmax_forward(const Tensor& x, const Tensor& y, bool log) {
  const char* op = log ? "log_softmax" : "softmax";
  const auto [rows, n] = last_dim_rows(x);
  if (rows == 0) return;
  cudaStream_t stream = stream_for(x);
  dispatch_floating(x.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* xp = static_cast<const T*>(x.raw_data());
    T* yp = static_cast<T*>(y.raw_data());
    // Packs at any row alignment, as long as x and y share it.
    const bool packed = same_phase16(xp, yp);
    dispatch_row_threads(n, [&](auto threads) {
      constexpr int kThreads = decltype(threads)::value;
      const dim3 grid(row_grid<kThreads>(rows)), block = row_block<kThreads>();
      auto launch = [&](auto pack) {
        constexpr int kPack = decltype(pack)::value;
        auto kernel =
            log ? softmax_forward_kernel<kThreads, kPack, true, T> : softmax_forward_kernel<kThreads, kPack, false, T>;
        precis::cuda::launch(kernel, grid, block, 0, stream, xp, yp, rows, n);
      };
      if (packed)
        launch(Width<Packed128<T>::size>{});
      else
        launch(Width<1>{});
    });
  });
  PRECIS_CUDA_CHECK_LAUNCH(op);
}

void softmax_backward(const Tensor& y, const Tensor& g, const Tensor& dx, bool log) {
  const char* op = log ? "log_softmax backward" : "softmax backward";
  const auto [rows, n] = last_dim_rows(y);
  if (rows == 0) return;
  cudaStream_t stream = stream_for(y);
  dispatch_floating(y.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* yp = static_cast<const T*>(y.raw_data());
    const T* gp = static_cast<const T*>(g.raw_data());
    T* dp = static_cast<T*>(dx.raw_data());
    const bool packed = same_phase16(yp, gp) && same_phase16(yp, dp);
    dispatch_row_threads(n, [&](auto threads) {
      constexpr int kThreads = decltype(threads)::value;
      const dim3 grid(row_grid<kThreads>(rows)), block = row_block<kThreads>();
      auto launch = [&](auto pack) {
        constexpr int kPack = decltype(pack)::value;
        auto kernel = log ? softmax_backward_kernel<kThreads, kPack, true, T>
                          : softmax_backward_kernel<kThreads, kPack, false, T>;
        precis::cuda::launch(kernel, grid, block, 0, stream, yp, gp, dp, rows, n);
      };
      if (packed)
        launch(Width<Packed128<T>::size>{});
      else
        launch(Width<1>{});
    });
  });
  PRECIS_CUDA_CHECK_LAUNCH(op);
}

}  // namespace precis::ops::cuda
