// The pooling kernels (ops/cuda/pool.h); the math is ops/pool.cpp's, the loops the CPU's.
// A thread owns one cell of the tensor it writes, taken in memory order, so in either
// memory format consecutive threads write consecutive addresses.
// Index math is 32-bit: a cell's (n, c, h, w) comes from its position by multiply-shift
// divisions (FastDivider) and the windows' bounds by int32 divisions. (64-bit divisions are
// emulated in dozens of instructions each, and ResNet-50's max-pool backward, with ten of them
// for every one of its 10^8 input cells, was compute-bound on them.) Batches of 2^31 elements or
// more are cut into launches over fewer samples, whose cells then number below 2^31.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "core/cuda/convert.cuh"
#include "core/cuda/dispatch.cuh"
#include "core/cuda/launch.cuh"
#include "core/cuda/strided_index.cuh"
#include "ops/cuda/pool.h"

namespace precis::ops::cuda {

using namespace precis::cuda;  // the device toolkit (core/cuda/)

namespace {

using Windows = BasicPoolWindows<int32_t>;

// A dense [N, C, H, W] tensor in NCHW or channels-last memory: the cell at memory position
// i, and the memory position of a cell, for fewer than 2^31 cells.
struct Layout {
  int32_t C, H, W;
  FastDivider by_C, by_H, by_W;
  bool channels_last;
  struct Cell {
    int32_t n, c, h, w;
  };

  Layout(int64_t c, int64_t h, int64_t w, bool cl)
      : C(static_cast<int32_t>(c)),
        H(static_cast<int32_t>(h)),
        W(static_cast<int32_t>(w)),
        by_C(static_cast<uint32_t>(c)),
        by_H(static_cast<uint32_t>(h)),
        by_W(static_cast<uint32_t>(w)),
        channels_last(cl) {}

  // Peels the innermost dims off i: channels-last memory runs c, w, h, n; NCHW w, h, c, n.
  __device__ Cell cell(uint32_t i) const {
    Cell cell;
    if (channels_last) {
      uint32_t q = by_C.div(i);
      cell.c = static_cast<int32_t>(i - q * C);
      uint32_t r = by_W.div(q);
      cell.w = static_cast<int32_t>(q - r * W);
      q = by_H.div(r);
      cell.h = static_cast<int32_t>(r - q * H);
      cell.n = static_cast<int32_t>(q);
    } else {
      uint32_t q = by_W.div(i);
      cell.w = static_cast<int32_t>(i - q * W);
      uint32_t r = by_H.div(q);
      cell.h = static_cast<int32_t>(q - r * H);
      q = by_C.div(r);
      cell.c = static_cast<int32_t>(r - q * C);
      cell.n = static_cast<int32_t>(q);
    }
    return cell;
  }
  __device__ int32_t at(int32_t n, int32_t c, int32_t h, int32_t w) const {
    return channels_last ? ((n * H + h) * W + w) * C + c : ((n * C + c) * H + h) * W + w;
  }
};

template <typename T>
__global__ void pool_forward_kernel(const T* x, T* y, int32_t* indices, Windows p, Layout in, Layout out,
                                    uint32_t total) {
  wait_for_previous_grid();
  allow_next_grid_to_start();
  using C = compute_t<T>;
  const uint32_t o = blockIdx.x * blockDim.x + threadIdx.x;
  if (o >= total) return;
  const Layout::Cell cell = out.cell(o);
  const int32_t oh = cell.h, ow = cell.w;
  if (indices) {
    C best = -INFINITY;
    int32_t where = p.row_begin(oh) * p.W + p.col_begin(ow);
    for (int32_t ih = p.row_begin(oh); ih < p.row_end(oh); ++ih)
      for (int32_t iw = p.col_begin(ow); iw < p.col_end(ow); ++iw) {
        const C v = convert_to<C>(x[in.at(cell.n, cell.c, ih, iw)]);
        if (v > best || isnan(v)) {
          best = v;
          where = ih * p.W + iw;
        }
      }
    y[o] = convert_to<T>(best);
    indices[o] = where;
  } else {
    C sum = 0;
    for (int32_t ih = p.row_begin(oh); ih < p.row_end(oh); ++ih)
      for (int32_t iw = p.col_begin(ow); iw < p.col_end(ow); ++iw)
        sum += convert_to<C>(x[in.at(cell.n, cell.c, ih, iw)]);
    y[o] = convert_to<T>(sum / static_cast<C>(p.divisor(oh, ow)));
  }
}

template <typename T>
__global__ void pool_backward_kernel(const T* gy, const int32_t* indices, T* dx, Windows p, Layout in, Layout out,
                                     uint32_t total) {
  wait_for_previous_grid();
  allow_next_grid_to_start();
  using C = compute_t<T>;
  const uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= total) return;
  const Layout::Cell cell = in.cell(i);
  if (!indices && p.adaptive && p.OH == 1 && p.OW == 1) {  // global average pooling: one window
    dx[i] = convert_to<T>(convert_to<C>(gy[out.at(cell.n, cell.c, 0, 0)]) / static_cast<C>(p.H * p.W));
    return;
  }
  const int32_t ih = cell.h, iw = cell.w;
  C acc = 0;
  for (int32_t oh = p.out_row_begin(ih); oh < p.out_row_end(ih); ++oh)
    for (int32_t ow = p.out_col_begin(iw); ow < p.out_col_end(iw); ++ow) {
      const int32_t o = out.at(cell.n, cell.c, oh, ow);
      if (indices) {
        if (indices[o] == ih * p.W + iw) acc += convert_to<C>(gy[o]);
      } else if (!p.adaptive || p.covers(oh, ow, ih, iw)) {
        acc += convert_to<C>(gy[o]) / static_cast<C>(p.divisor(oh, ow));
      }
    }
  dx[i] = convert_to<T>(acc);
}

Layout input_layout(const PoolWindows& p, MemoryFormat format) {
  return {p.C, p.H, p.W, format == MemoryFormat::channels_last};
}
Layout output_layout(const PoolWindows& p, MemoryFormat format) {
  return {p.C, p.OH, p.OW, format == MemoryFormat::channels_last};
}

// Calls launch(windows, n0) for runs of samples n0, n0 + 1, ... (windows.N of them) whose input
// and output cells each number below 2^31, with the windows in 32 bits. Samples are the
// outermost dim in both memory formats, so a run is one block of memory in every operand.
template <typename Launch>
void over_sample_runs(const PoolWindows& p, const char* op, Launch&& launch) {
  const int64_t per_sample = p.C * std::max(p.H * p.W, p.OH * p.OW);
  PRECIS_CHECK(per_sample <= INT32_MAX && p.H * p.OH <= INT32_MAX && p.W * p.OW <= INT32_MAX, op, ": one sample of ",
               p.C, " x ", p.H, " x ", p.W, " cells pooled to ", p.OH, " x ", p.OW,
               " is beyond the GPU kernels' 32-bit indices (2^31 cells a sample); split the channels");
  const int64_t run = std::max<int64_t>(1, INT32_MAX / std::max<int64_t>(per_sample, 1));
  for (int64_t n0 = 0; n0 < p.N; n0 += run) {
    PoolWindows part = p;
    part.N = std::min(run, p.N - n0);
    launch(part.narrowed<int32_t>(), n0);
  }
}

}  // namespace

void pool2d_forward(const Tensor& x, const Tensor& y, const Tensor& indices, const PoolWindows& p,
                    MemoryFormat format) {
  if (y.numel() == 0) return;
  const char* op = indices.defined() ? "max_pool2d" : "avg_pool2d";
  const Layout in = input_layout(p, format), out = output_layout(p, format);
  dispatch_floating(x.dtype(), "pool2d", [&](auto tag) {
    using T = typename decltype(tag)::type;
    over_sample_runs(p, op, [&](const Windows& w, int64_t n0) {
      const int64_t x_at = n0 * p.C * p.H * p.W, y_at = n0 * p.C * p.OH * p.OW;
      const int64_t total = static_cast<int64_t>(w.N) * p.C * p.OH * p.OW;
      launch(pool_forward_kernel<T>, grid_for(total), kBlockSize, 0, stream_for(y), data_of<const T>(x) + x_at,
             data_of<T>(y) + y_at, indices.defined() ? data_of<int32_t>(indices) + y_at : nullptr, w, in, out,
             static_cast<uint32_t>(total));
    });
  });
  PRECIS_CUDA_CHECK_LAUNCH(op);
}

void pool2d_backward(const Tensor& gy, const Tensor& indices, const Tensor& dx, const PoolWindows& p,
                     MemoryFormat format) {
  if (dx.numel() == 0) return;
  const char* op = indices.defined() ? "max_pool2d backward" : "avg_pool2d backward";
  const Layout in = input_layout(p, format), out = output_layout(p, format);
  dispatch_floating(dx.dtype(), "pool2d", [&](auto tag) {
    using T = typename decltype(tag)::type;
    over_sample_runs(p, op, [&](const Windows& w, int64_t n0) {
      const int64_t x_at = n0 * p.C * p.H * p.W, y_at = n0 * p.C * p.OH * p.OW;
      const int64_t total = static_cast<int64_t>(w.N) * p.C * p.H * p.W;
      launch(pool_backward_kernel<T>, grid_for(total), kBlockSize, 0, stream_for(dx), data_of<const T>(gy) + y_at,
             indices.defined() ? data_of<const int32_t>(indices) + y_at : nullptr, data_of<T>(dx) + x_at, w, in, out,
             static_cast<uint32_t>(total));
    });
  });
  PRECIS_CUDA_CHECK_LAUNCH(op);
}

}  // namespace precis::ops::cuda
