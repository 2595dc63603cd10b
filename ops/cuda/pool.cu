// The pooling kernels (ops/cuda/pool.h); the math is ops/pool.cpp's, the loops the CPU's.
// A thread owns one cell of the tensor it writes, taken in memory order, so in either
// memory format consecutive threads write consecutive addresses.
#include <cmath>

#include "core/cuda/convert.cuh"
#include "core/cuda/dispatch.cuh"
#include "core/cuda/launch.cuh"
#include "ops/cuda/pool.h"

namespace precis::ops::cuda {

using namespace precis::cuda;  // the device toolkit (core/cuda/)

namespace {

// A dense [N, C, H, W] tensor in NCHW or channels-last memory: the cell at memory position
// i, and the memory position of a cell.
struct Layout {
  int64_t C, H, W;
  bool channels_last;
  struct Cell {
    int64_t n, c, h, w;
  };
  __device__ Cell cell(int64_t i) const {
    if (channels_last) return {i / (H * W * C), i % C, (i / (W * C)) % H, (i / C) % W};
    return {i / (C * H * W), (i / (H * W)) % C, (i / W) % H, i % W};
  }
  __device__ int64_t at(int64_t n, int64_t c, int64_t h, int64_t w) const {
    return channels_last ? ((n * H + h) * W + w) * C + c : ((n * C + c) * H + h) * W + w;
  }
};

template <typename T>
__global__ void pool_forward_kernel(const T* x, T* y, int32_t* indices, PoolWindows p, Layout in, Layout out,
                                    int64_t total) {
  wait_for_previous_grid();
  allow_next_grid_to_start();
  using C = compute_t<T>;
  const int64_t o = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (o >= total) return;
  const Layout::Cell cell = out.cell(o);
  const int64_t oh = cell.h, ow = cell.w;
  if (indices) {
    C best = -INFINITY;
    int64_t where = p.row_begin(oh) * p.W + p.col_begin(ow);
    for (int64_t ih = p.row_begin(oh); ih < p.row_end(oh); ++ih)
      for (int64_t iw = p.col_begin(ow); iw < p.col_end(ow); ++iw) {
        const C v = convert_to<C>(x[in.at(cell.n, cell.c, ih, iw)]);
        if (v > best || isnan(v)) {
          best = v;
          where = ih * p.W + iw;
        }
      }
    y[o] = convert_to<T>(best);
    indices[o] = static_cast<int32_t>(where);
  } else {
    C sum = 0;
    for (int64_t ih = p.row_begin(oh); ih < p.row_end(oh); ++ih)
      for (int64_t iw = p.col_begin(ow); iw < p.col_end(ow); ++iw)
        sum += convert_to<C>(x[in.at(cell.n, cell.c, ih, iw)]);
    y[o] = convert_to<T>(sum / static_cast<C>(p.divisor(oh, ow)));
  }
}

template <typename T>
__global__ void pool_backward_kernel(const T* gy, const int32_t* indices, T* dx, PoolWindows p, Layout in, Layout out,
                                     int64_t total) {
  wait_for_previous_grid();
  allow_next_grid_to_start();
  using C = compute_t<T>;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= total) return;
  const Layout::Cell cell = in.cell(i);
  const int64_t ih = cell.h, iw = cell.w;
  C acc = 0;
  for (int64_t oh = p.out_row_begin(ih); oh < p.out_row_end(ih); ++oh)
    for (int64_t ow = p.out_col_begin(iw); ow < p.out_col_end(iw); ++ow) {
      const int64_t o = out.at(cell.n, cell.c, oh, ow);
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

}  // namespace

void pool2d_forward(const Tensor& x, const Tensor& y, const Tensor& indices, const PoolWindows& p,
                    MemoryFormat format) {
  const int64_t total = y.numel();
  if (total == 0) return;
  dispatch_floating(x.dtype(), "pool2d", [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch(pool_forward_kernel<T>, grid_for(total), kBlockSize, 0, stream_for(y), data_of<const T>(x), data_of<T>(y),
           indices.defined() ? data_of<int32_t>(indices) : nullptr, p, input_layout(p, format),
           output_layout(p, format), total);
  });
  PRECIS_CUDA_CHECK_LAUNCH(indices.defined() ? "max_pool2d" : "avg_pool2d");
}

void pool2d_backward(const Tensor& gy, const Tensor& indices, const Tensor& dx, const PoolWindows& p,
                     MemoryFormat format) {
  const int64_t total = dx.numel();
  if (total == 0) return;
  dispatch_floating(dx.dtype(), "pool2d", [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch(pool_backward_kernel<T>, grid_for(total), kBlockSize, 0, stream_for(dx), data_of<const T>(gy),
           indices.defined() ? data_of<const int32_t>(indices) : nullptr, data_of<T>(dx), p, input_layout(p, format),
           output_layout(p, format), total);
  });
  PRECIS_CUDA_CHECK_LAUNCH(indices.defined() ? "max_pool2d backward" : "avg_pool2d backward");
}

}  // namespace precis::ops::cuda
