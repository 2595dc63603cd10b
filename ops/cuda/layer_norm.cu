// layer_norm over the last dim, rows of C values (the math is derived in ops/layer_norm.cpp):
//   forward:  mean, rstd = 1/sqrt(var + eps), y = (x - mean) rstd w + b, a warp (or block) per row
//   backward: dx = rstd (dxhat - mean(dxhat) - xhat mean(dxhat xhat)), dxhat = g w, a block per
//             chunk of rows; dw = sum g xhat and db = sum g over rows, reduced in two stages:
//             each block sums its rows per column in registers and writes one partial row,
//             then a second kernel adds the partial rows in block order. No atomics, so the
//             result is the same on every run.
// Statistics, weight and bias in f32 (f64 for f64 x).
#include <algorithm>

#include "ops/cuda/nn_kernels.h"

namespace precis::ops::cuda {

namespace {

// Forward: pass 1 sums x for the mean, pass 2 sums (x - mean)^2 (two passes, as the CPU
// kernel, rather than E[x^2] - mean^2, which cancels), pass 3 writes y.
// Bytes: x read three times (passes 2 and 3 mostly from L1/L2), y written once, 8 bytes of statistics per row.
template <int kThreads, int kPack, typename T, typename A = compute_t<T>>
__global__ void PRECIS_ROW_LAUNCH_BOUNDS(kThreads)
    layer_norm_forward_kernel(const T* x, const A* weight, const A* bias, T* y, A* mean, A* rstd, int64_t rows,
                              int64_t C, A eps) {
  const int64_t row = row_index();
  if (row >= rows) return;
  const T* xr = x + row * C;
  T* yr = y + row * C;
  A sum = 0;
  for_each_in_row<kPack>(xr, C, threadIdx.x, kThreads, [&](int64_t i, auto width) {
    constexpr int W = decltype(width)::value;
    const Pack<T, W> v = load_pack<W>(xr + i);
#pragma unroll
    for (int k = 0; k < W; ++k) sum += convert_to<A>(v.v[k]);
  });
  const A mu = row_all_reduce<kThreads>(sum, SumOp{}) / static_cast<A>(C);
  A squares = 0;
  for_each_in_row<kPack>(xr, C, threadIdx.x, kThreads, [&](int64_t i, auto width) {
    constexpr int W = decltype(width)::value;
    const Pack<T, W> v = load_pack<W>(xr + i);
#pragma unroll
    for (int k = 0; k < W; ++k) {
      const A d = convert_to<A>(v.v[k]) - mu;
      squares += d * d;
    }
  });
  const A rs = A(1) / ::sqrt(row_all_reduce<kThreads>(squares, SumOp{}) / static_cast<A>(C) + eps);
  for_each_in_row<kPack>(xr, C, threadIdx.x, kThreads, [&](int64_t i, auto width) {
    constexpr int W = decltype(width)::value;
    const Pack<T, W> v = load_pack<W>(xr + i);
    Pack<T, W> out;
#pragma unroll
    for (int k = 0; k < W; ++k) {
      out.v[k] = convert_to<T>((convert_to<A>(v.v[k]) - mu) * rs * weight[i + k] + bias[i + k]);
    }
    store_pack<W>(yr + i, out);
  });
  if (threadIdx.x == 0) {
    mean[row] = mu;
    rstd[row] = rs;
  }
}

// Backward, stage 1: block b takes rows [b * rows_per_block, ...) one at a time. Thread t
// owns the columns (p * blockDim.x + t) * kPack + k, p < kPacks, k < kPack, for every row,
// so its dw and db sums stay in registers. Per row, one block reduction gives mean(dxhat)
// and mean(dxhat xhat); then dx is written. At the end each block writes its partial dw
// and db rows to partial_dw/partial_db [blocks, C] (null: not wanted).
// Bytes: x and g read twice per row (the second time mostly from L1), dx written once;
// 2 * blocks * C statistics-dtype values of partials.
template <int kPacks, int kPack, typename T, typename A = compute_t<T>>
__global__ void __launch_bounds__(1024)
    layer_norm_backward_kernel(const T* x, const T* g, const A* weight, const A* mean, const A* rstd, T* dx,
                               A* partial_dw, A* partial_db, int64_t rows, int64_t C, int64_t rows_per_block) {
  const int64_t first = blockIdx.x * rows_per_block;
  const int64_t last = first + rows_per_block < rows ? first + rows_per_block : rows;
  A dw[kPacks][kPack] = {}, db[kPacks][kPack] = {};
  for (int64_t row = first; row < last; ++row) {
    const T* xr = x + row * C;
    const T* gr = g + row * C;
    const A mu = mean[row], rs = rstd[row];
    Pair<A> sums{0, 0};  // sum dxhat, sum dxhat xhat
#pragma unroll
    for (int p = 0; p < kPacks; ++p) {
      const int64_t col = (static_cast<int64_t>(p) * blockDim.x + threadIdx.x) * kPack;
      if (col >= C) continue;
      const Pack<T, kPack> xv = load_pack<kPack>(xr + col), gv = load_pack<kPack>(gr + col);
#pragma unroll
      for (int k = 0; k < kPack; ++k) {
        const A xhat = (convert_to<A>(xv.v[k]) - mu) * rs;
        const A dxhat = convert_to<A>(gv.v[k]) * weight[col + k];
        sums.first += dxhat;
        sums.second += dxhat * xhat;
      }
    }
    sums = block_all_reduce(sums, SumOp{});
    const A mean_dxhat = sums.first / static_cast<A>(C), mean_dxhat_xhat = sums.second / static_cast<A>(C);
#pragma unroll
    for (int p = 0; p < kPacks; ++p) {
      const int64_t col = (static_cast<int64_t>(p) * blockDim.x + threadIdx.x) * kPack;
      if (col >= C) continue;
      const Pack<T, kPack> xv = load_pack<kPack>(xr + col), gv = load_pack<kPack>(gr + col);
      Pack<T, kPack> out;
#pragma unroll
      for (int k = 0; k < kPack; ++k) {
        const A xhat = (convert_to<A>(xv.v[k]) - mu) * rs, gk = convert_to<A>(gv.v[k]);
        dw[p][k] += gk * xhat;
        db[p][k] += gk;
        out.v[k] = convert_to<T>(rs * (gk * weight[col + k] - mean_dxhat - xhat * mean_dxhat_xhat));
      }
      if (dx) store_pack<kPack>(dx + row * C + col, out);
    }
  }
#pragma unroll
  for (int p = 0; p < kPacks; ++p) {
    const int64_t col = (static_cast<int64_t>(p) * blockDim.x + threadIdx.x) * kPack;
    if (col >= C) continue;
#pragma unroll
    for (int k = 0; k < kPack; ++k) {
      if (partial_dw) partial_dw[blockIdx.x * C + col + k] = dw[p][k];
      if (partial_db) partial_db[blockIdx.x * C + col + k] = db[p][k];
    }
  }
}

// Backward, stage 2: out[c] = sum over b of partial[b, c], b in order, for out = dw
// (blockIdx.y 0) and db (1). A block covers 32 columns; its kSlices rows of threads each
// sum every kSlices-th partial row, then one thread per column adds the slices in order.
// Bytes: the partials read once, 2 * C values written.
constexpr int kSlices = 16;
template <typename A>
__global__ void __launch_bounds__(32 * kSlices)
    layer_norm_param_grads_kernel(const A* partial_dw, const A* partial_db, A* dw, A* db, int64_t blocks, int64_t C) {
  const A* partial = blockIdx.y == 0 ? partial_dw : partial_db;
  A* out = blockIdx.y == 0 ? dw : db;
  if (!out) return;
  __shared__ A slices[kSlices][33];
  const int64_t col = static_cast<int64_t>(blockIdx.x) * 32 + threadIdx.x;
  A sum = 0;
  if (col < C)
    for (int64_t b = threadIdx.y; b < blocks; b += kSlices) sum += partial[b * C + col];
  slices[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y == 0 && col < C) {
    for (int s = 1; s < kSlices; ++s) sum += slices[s][threadIdx.x];
    out[col] = sum;
  }
}

// The longest row the backward kernel takes: kPacks * kPack <= kMaxPerThread<A> values per
// thread (their dw and db sums fit in registers), 1024 threads.
template <typename A>
inline constexpr int kMaxPerThread = 64 / sizeof(A);
constexpr int64_t kMaxBackwardBlocks = 512;

// Calls run(kernel) with the backward kernel of the fewest packs per thread (a power of
// two) that covers `packs`; the row-length check keeps packs * kPack <= kMaxPerThread.
template <int kPacks, int kPack, typename T, typename Run>
void run_with_packs(int64_t packs, Run&& run) {
  if constexpr (kPacks * kPack >= kMaxPerThread<compute_t<T>>) {
    run(layer_norm_backward_kernel<kPacks, kPack, T>);
  } else {
    if (packs <= kPacks)
      run(layer_norm_backward_kernel<kPacks, kPack, T>);
    else
      run_with_packs<kPacks * 2, kPack, T>(packs, run);
  }
}

}  // namespace

void layer_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps, const Tensor& y,
                        const Tensor& mean, const Tensor& rstd) {
  const char* op = "layer_norm";
  const int64_t C = x.shape().back(), rows = C == 0 ? 0 : x.numel() / C;
  if (rows == 0) return;
  cudaStream_t stream = stream_for(x);
  dispatch_floating(x.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = compute_t<T>;
    const T* xp = static_cast<const T*>(x.raw_data());
    T* yp = static_cast<T*>(y.raw_data());
    const bool packed = same_phase16(xp, yp);
    dispatch_row_threads(C, [&](auto threads) {
      constexpr int kThreads = decltype(threads)::value;
      const dim3 grid(row_grid<kThreads>(rows)), block = row_block<kThreads>();
      auto launch = [&](auto kernel) {
        kernel<<<grid, block, 0, stream>>>(xp, static_cast<const A*>(weight.raw_data()),
                                           static_cast<const A*>(bias.raw_data()), yp, static_cast<A*>(mean.raw_data()),
                                           static_cast<A*>(rstd.raw_data()), rows, C, static_cast<A>(eps));
      };
      if (packed)
        launch(layer_norm_forward_kernel<kThreads, Packed128<T>::size, T>);
      else
        launch(layer_norm_forward_kernel<kThreads, 1, T>);
    });
  });
  PRECIS_CUDA_CHECK_LAUNCH(op);
}

void layer_norm_backward(const Tensor& x, const Tensor& g, const Tensor& weight, const Tensor& mean, const Tensor& rstd,
                         const Tensor& dx, const Tensor& dweight, const Tensor& dbias) {
  const char* op = "layer_norm backward";
  const int64_t C = x.shape().back(), rows = C == 0 ? 0 : x.numel() / C;
  if (C == 0) return;
  cudaStream_t stream = stream_for(x);
  const bool param_grads = dweight.defined() || dbias.defined();
  if (rows == 0) {  // no rows: the parameter gradients are sums of nothing
    for (const Tensor* t : {&dweight, &dbias})
      if (t->defined()) PRECIS_CUDA_CHECK(cudaMemsetAsync(t->raw_data(), 0, t->nbytes(), stream), op);
    return;
  }
  const int64_t rows_per_block = (rows + kMaxBackwardBlocks - 1) / kMaxBackwardBlocks;
  const int64_t blocks = (rows + rows_per_block - 1) / rows_per_block;
  dispatch_floating(x.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = compute_t<T>;
    PRECIS_CHECK(C <= 1024 * kMaxPerThread<A>, op, ": rows of ", C, " values are longer than the CUDA kernel takes (",
                 1024 * kMaxPerThread<A>, " for ", x.dtype(), ")");
    const T* xp = static_cast<const T*>(x.raw_data());
    const T* gp = static_cast<const T*>(g.raw_data());
    T* dxp = dx.defined() ? static_cast<T*>(dx.raw_data()) : nullptr;
    // Partial rows, [2, blocks, C]: dw then db.
    Tensor partials = param_grads ? empty({2, blocks, C}, mean.dtype(), x.device()) : Tensor();
    A* partial_dw = dweight.defined() ? static_cast<A*>(partials.raw_data()) : nullptr;
    A* partial_db = dbias.defined() ? static_cast<A*>(partials.raw_data()) + blocks * C : nullptr;
    // Packs need every row to start 16-byte aligned: C a multiple of the pack and aligned bases.
    constexpr int kWide = Packed128<T>::size;
    const bool packed = C % kWide == 0 && aligned16(xp) && aligned16(gp) && (!dxp || aligned16(dxp));
    auto launch = [&](auto pack) {
      constexpr int kPack = decltype(pack)::value;
      const int64_t per_row = (C + kPack - 1) / kPack;
      const int threads = static_cast<int>(std::min<int64_t>(1024, (per_row + 31) / 32 * 32));
      const int64_t packs = (per_row + threads - 1) / threads;
      run_with_packs<1, kPack, T>(packs, [&](auto kernel) {
        kernel<<<static_cast<unsigned>(blocks), threads, 0, stream>>>(
            xp, gp, static_cast<const A*>(weight.raw_data()), static_cast<const A*>(mean.raw_data()),
            static_cast<const A*>(rstd.raw_data()), dxp, partial_dw, partial_db, rows, C, rows_per_block);
      });
    };
    if (packed)
      launch(Width<kWide>{});
    else
      launch(Width<1>{});
    PRECIS_CUDA_CHECK_LAUNCH(op);
    if (param_grads) {
      layer_norm_param_grads_kernel<A><<<dim3(static_cast<unsigned>((C + 31) / 32), 2), dim3(32, kSlices), 0, stream>>>(
          partial_dw, partial_db, dweight.defined() ? static_cast<A*>(dweight.raw_data()) : nullptr,
          dbias.defined() ? static_cast<A*>(dbias.raw_data()) : nullptr, blocks, C);
      PRECIS_CUDA_CHECK_LAUNCH(op);
    }
  });
}

}  // namespace precis::ops::cuda
