// layer_norm over the last dim, rows of C values (the math is derived in ops/layer_norm.cpp):
//   forward:  mean, rstd = 1/sqrt(var + eps), y = (x - mean) rstd w + b, a warp (or block) per row
//   backward: dx = rstd (dxhat - mean(dxhat) - xhat mean(dxhat xhat)), dxhat = g w, a block per
//             chunk of rows; dw = sum g xhat and db = sum g over rows, reduced in two stages:
//             each block sums its rows per column in registers and writes one partial row,
//             then a second kernel adds the partial rows in block order. No atomics, so the
//             result is the same on every run.
// Statistics, weight and bias in f32 (f64 for f64 x).
//
// The same kernels do the residual add fused with it (add_layer_norm): the forward reads x
// and the residual r, writes their sum s = x + r (rounded to x's dtype T) and normalises s; the
// backward adds the sum's own gradient g_s to ds and writes ds once more in r's dtype where
// that differs (r's gradient), so neither the add nor its gradient costs a pass of its own.
// x, s and dx are in T; y and its gradient g may be f32 for f16/bf16 T (autocast's f32
// output) or f16/bf16 for f32 T (a norm that feeds a linear under autocast); r and dr may be
// f16/bf16 for f32 T. Mixed dtypes are visited in packs of Packed128<T>::size elements, each
// array moving that many of its own.
#include <algorithm>

#include "ops/cuda/nn_kernels.h"

namespace precis::ops::cuda {

namespace {

// Forward: pass 1 sums x (or s = x + r, which it writes) for the mean, pass 2 sums
// (x - mean)^2 (two passes, as the CPU kernel, rather than E[x^2] - mean^2, which cancels),
// pass 3 writes y. With a residual, passes 2 and 3 read s back (each thread its own writes).
// Bytes: x read three times (passes 2 and 3 mostly from L1/L2), y written once, 8 bytes of
// statistics per row; with a residual also r read and s written once (add + layer_norm apart
// would read s again from memory, and launch twice).
template <int kThreads, int kPack, typename T, typename R, typename Y, typename A = compute_t<T>>
__global__ void PRECIS_ROW_LAUNCH_BOUNDS(kThreads)
    layer_norm_forward_kernel(const T* x, const R* residual, T* sum_out, const A* weight, const A* bias, Y* y, A* mean,
                              A* rstd, int64_t rows, int64_t C, A eps) {
  const int64_t row = row_index();
  if (row >= rows) return;
  Y* yr = y + row * C;
  A sum = 0;
  for_each_in_row<kPack>(x + row * C, C, threadIdx.x, kThreads, [&](int64_t i, auto width) {
    constexpr int W = decltype(width)::value;
    Pack<T, W> v = load_pack<W>(x + row * C + i);
    if (residual) {
      const Pack<R, W> r = load_pack<W>(residual + row * C + i);
#pragma unroll
      for (int k = 0; k < W; ++k) v.v[k] = convert_to<T>(convert_to<A>(v.v[k]) + convert_to<A>(r.v[k]));
      store_pack<W>(sum_out + row * C + i, v);
    }
#pragma unroll
    for (int k = 0; k < W; ++k) sum += convert_to<A>(v.v[k]);
  });
  const T* xr = (residual ? sum_out : x) + row * C;
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
    Pack<Y, W> out;
#pragma unroll
    for (int k = 0; k < W; ++k) {
      out.v[k] = convert_to<Y>((convert_to<A>(v.v[k]) - mu) * rs * weight[i + k] + bias[i + k]);
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
// and mean(dxhat xhat); then dx (plus g_sum, when given) is written, to dx and/or, in the
// residual's dtype, to dr (null: not wanted). At the end each block writes its partial dw
// and db rows to partial_dw/partial_db [blocks, C] (null: not wanted).
// Bytes: x and g read twice per row (the second time mostly from L1), dx written once;
// 2 * blocks * C statistics-dtype values of partials; with add_layer_norm g_sum read and dr
// written once (apart, the gradients' sum and r's cast would each be a pass of their own).
template <int kPacks, int kPack, typename T, typename G, typename R, typename A = compute_t<T>>
__global__ void __launch_bounds__(1024)
    layer_norm_backward_kernel(const T* x, const G* g, const T* g_sum, const A* weight, const A* mean, const A* rstd,
                               T* dx, R* dr, A* partial_dw, A* partial_db, int64_t rows, int64_t C,
                               int64_t rows_per_block) {
  const int64_t first = blockIdx.x * rows_per_block;
  const int64_t last = first + rows_per_block < rows ? first + rows_per_block : rows;
  A dw[kPacks][kPack] = {}, db[kPacks][kPack] = {};
  for (int64_t row = first; row < last; ++row) {
    const T* xr = x + row * C;
    const G* gr = g + row * C;
    const A mu = mean[row], rs = rstd[row];
    Pair<A> sums{0, 0};  // sum dxhat, sum dxhat xhat
#pragma unroll
    for (int p = 0; p < kPacks; ++p) {
      const int64_t col = (static_cast<int64_t>(p) * blockDim.x + threadIdx.x) * kPack;
      if (col >= C) continue;
      const Pack<T, kPack> xv = load_pack<kPack>(xr + col);
      const Pack<G, kPack> gv = load_pack<kPack>(gr + col);
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
      const Pack<T, kPack> xv = load_pack<kPack>(xr + col);
      const Pack<G, kPack> gv = load_pack<kPack>(gr + col);
      Pack<T, kPack> gs{};
      if (g_sum) gs = load_pack<kPack>(g_sum + row * C + col);
      Pack<T, kPack> out;
      Pack<R, kPack> out_r;
#pragma unroll
      for (int k = 0; k < kPack; ++k) {
        const A xhat = (convert_to<A>(xv.v[k]) - mu) * rs, gk = convert_to<A>(gv.v[k]);
        dw[p][k] += gk * xhat;
        db[p][k] += gk;
        A d = rs * (gk * weight[col + k] - mean_dxhat - xhat * mean_dxhat_xhat);
        if (g_sum) d += convert_to<A>(gs.v[k]);
        out.v[k] = convert_to<T>(d);
        out_r.v[k] = convert_to<R>(d);
      }
      if (dx) store_pack<kPack>(dx + row * C + col, out);
      if (dr) store_pack<kPack>(dr + row * C + col, out_r);
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
template <int kPacks, int kPack, typename T, typename G, typename R, typename Run>
void run_with_packs(int64_t packs, Run&& run) {
  if constexpr (kPacks * kPack >= kMaxPerThread<compute_t<T>>) {
    run(layer_norm_backward_kernel<kPacks, kPack, T, G, R>);
  } else {
    if (packs <= kPacks)
      run(layer_norm_backward_kernel<kPacks, kPack, T, G, R>);
    else
      run_with_packs<kPacks * 2, kPack, T, G, R>(packs, run);
  }
}

// Calls fn(TypeTag<U>) with the device type of `dtype`, a dtype the kernels take beside x's T:
// T, f16/bf16 beside f32 T, and (for y and its gradient: `residual` false) f32 beside f16/bf16 T.
template <typename T, typename Fn>
void dispatch_beside(DType x_dtype, DType dtype, bool residual, const char* op, Fn&& fn) {
  if (dtype == x_dtype) return fn(TypeTag<T>{});
  if constexpr (std::is_same_v<T, float>) {
    if (dtype == DType::f16) return fn(TypeTag<__half>{});
    if (dtype == DType::bf16) return fn(TypeTag<__nv_bfloat16>{});
  } else if constexpr (is_half_v<T>) {
    if (!residual && dtype == DType::f32) return fn(TypeTag<float>{});
  }
  PRECIS_FAIL(op, ": no CUDA kernel for a ", dtype, residual ? " residual" : " output", " beside a ", x_dtype,
              " input");
}

template <typename U>
U* pointer(const Tensor& t) {
  return t.defined() ? static_cast<U*>(t.raw_data()) : nullptr;
}

}  // namespace

void layer_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps, const Tensor& y,
                        const Tensor& mean, const Tensor& rstd, const Tensor& residual, const Tensor& sum) {
  const char* op = residual.defined() ? "add_layer_norm" : "layer_norm";
  const int64_t C = x.shape().back(), rows = C == 0 ? 0 : x.numel() / C;
  if (rows == 0) return;
  cudaStream_t stream = stream_for(x);
  dispatch_floating(x.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = compute_t<T>;
    dispatch_beside<T>(x.dtype(), residual.defined() ? residual.dtype() : x.dtype(), true, op, [&](auto r_tag) {
      using R = typename decltype(r_tag)::type;
      dispatch_beside<T>(x.dtype(), y.dtype(), false, op, [&](auto y_tag) {
        using Y = typename decltype(y_tag)::type;
        const T* xp = pointer<const T>(x);
        const R* rp = pointer<const R>(residual);
        T* sp = pointer<T>(sum);
        Y* yp = pointer<Y>(y);
        constexpr int kWide = Packed128<T>::size;
        const bool packed =
            same_pack_phase<kWide>(xp, rp) && same_pack_phase<kWide>(xp, sp) && same_pack_phase<kWide>(xp, yp);
        dispatch_row_threads(C, [&](auto threads) {
          constexpr int kThreads = decltype(threads)::value;
          const dim3 grid(row_grid<kThreads>(rows)), block = row_block<kThreads>();
          auto launch = [&](auto kernel) {
            kernel<<<grid, block, 0, stream>>>(xp, rp, sp, pointer<const A>(weight), pointer<const A>(bias), yp,
                                               pointer<A>(mean), pointer<A>(rstd), rows, C, static_cast<A>(eps));
          };
          if (packed)
            launch(layer_norm_forward_kernel<kThreads, kWide, T, R, Y>);
          else
            launch(layer_norm_forward_kernel<kThreads, 1, T, R, Y>);
        });
      });
    });
  });
  PRECIS_CUDA_CHECK_LAUNCH(op);
}

void layer_norm_backward(const Tensor& x, const Tensor& g, const Tensor& weight, const Tensor& mean, const Tensor& rstd,
                         const Tensor& dx, const Tensor& dweight, const Tensor& dbias, const Tensor& g_sum,
                         const Tensor& dresidual) {
  const char* op = g_sum.defined() || dresidual.defined() ? "add_layer_norm backward" : "layer_norm backward";
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
    dispatch_beside<T>(x.dtype(), g.dtype(), false, op, [&](auto g_tag) {
      using G = typename decltype(g_tag)::type;
      dispatch_beside<T>(x.dtype(), dresidual.defined() ? dresidual.dtype() : x.dtype(), true, op, [&](auto r_tag) {
        using R = typename decltype(r_tag)::type;
        const T* xp = pointer<const T>(x);
        const G* gp = pointer<const G>(g);
        const T* gsp = pointer<const T>(g_sum);
        T* dxp = pointer<T>(dx);
        R* drp = pointer<R>(dresidual);
        // Partial rows, [2, blocks, C]: dw then db.
        Tensor partials = param_grads ? empty({2, blocks, C}, mean.dtype(), x.device()) : Tensor();
        A* partial_dw = dweight.defined() ? pointer<A>(partials) : nullptr;
        A* partial_db = dbias.defined() ? pointer<A>(partials) + blocks * C : nullptr;
        // Packs need every row to start at a pack boundary: C a multiple of the pack and aligned bases.
        constexpr int kWide = Packed128<T>::size;
        const bool packed = C % kWide == 0 && pack_aligned<kWide>(xp) && pack_aligned<kWide>(gp) &&
                            pack_aligned<kWide>(gsp) && pack_aligned<kWide>(dxp) && pack_aligned<kWide>(drp);
        auto launch = [&](auto pack) {
          constexpr int kPack = decltype(pack)::value;
          const int64_t per_row = (C + kPack - 1) / kPack;
          const int threads = static_cast<int>(std::min<int64_t>(1024, (per_row + 31) / 32 * 32));
          const int64_t packs = (per_row + threads - 1) / threads;
          run_with_packs<1, kPack, T, G, R>(packs, [&](auto kernel) {
            kernel<<<static_cast<unsigned>(blocks), threads, 0, stream>>>(
                xp, gp, gsp, pointer<const A>(weight), pointer<const A>(mean), pointer<const A>(rstd), dxp, drp,
                partial_dw, partial_db, rows, C, rows_per_block);
          });
        };
        if (packed)
          launch(Width<kWide>{});
        else
          launch(Width<1>{});
        PRECIS_CUDA_CHECK_LAUNCH(op);
        if (param_grads) {
          layer_norm_param_grads_kernel<A>
              <<<dim3(static_cast<unsigned>((C + 31) / 32), 2), dim3(32, kSlices), 0, stream>>>(
                  partial_dw, partial_db, pointer<A>(dweight), pointer<A>(dbias), blocks, C);
          PRECIS_CUDA_CHECK_LAUNCH(op);
        }
      });
    });
  });
}

}  // namespace precis::ops::cuda
