// The pooling kernels (ops/cuda/pool.h); the math is ops/pool.cpp's, the loops the CPU's.
// A thread owns one cell of the tensor it writes, taken in memory order, so in either
// memory format consecutive threads write consecutive addresses. Channels-last, a thread owns
// V consecutive channels of its cell (a 16-byte pack when C allows): the window bounds and
// index math are then paid once per V channels, and every access is one vector load or store
// (each channel's values are visited in the same order as with V = 1, so the results agree).
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
#include "core/cuda/pack.cuh"
#include "core/cuda/strided_index.cuh"
#include "ops/cuda/pool.h"

namespace precis::ops::cuda {

using namespace precis::cuda;  // the device toolkit (core/cuda/)

namespace {

using Windows = BasicPoolWindows<int32_t>;

// A dense [N, C, H, W] tensor in NCHW or channels-last memory: the cell at memory position
// i, and the memory position of a cell, for fewer than 2^31 cells. A kernel of V channels a
// thread sees C / V channel packs: positions and c count packs.
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

template <typename T, int V, typename I>
__global__ void pool_forward_kernel(const T* x, T* y, I* indices, Windows p, Layout in, Layout out, uint32_t total) {
  wait_for_previous_grid();
  allow_next_grid_to_start();
  using C = compute_t<T>;
  const uint32_t o = blockIdx.x * blockDim.x + threadIdx.x;
  if (o >= total) return;
  const Layout::Cell cell = out.cell(o);
  const int32_t oh = cell.h, ow = cell.w;
  Pack<T, V> result;
  if (indices) {
    C best[V];
    Pack<I, V> where;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      best[k] = -INFINITY;
      where.v[k] = static_cast<I>(p.place_in_window(oh, ow, p.row_begin(oh), p.col_begin(ow)));
    }
    for (int32_t ih = p.row_begin(oh); ih < p.row_end(oh); ++ih)
      for (int32_t iw = p.col_begin(ow); iw < p.col_end(ow); ++iw) {
        const Pack<T, V> xs = load_pack<V>(x + static_cast<uint32_t>(in.at(cell.n, cell.c, ih, iw)) * V);
#pragma unroll
        for (int k = 0; k < V; ++k) {
          const C v = convert_to<C>(xs.v[k]);
          if (v > best[k] || isnan(v)) {
            best[k] = v;
            where.v[k] = static_cast<I>(p.place_in_window(oh, ow, ih, iw));
          }
        }
      }
#pragma unroll
    for (int k = 0; k < V; ++k) result.v[k] = convert_to<T>(best[k]);
    store_pack(indices + o * V, where);
  } else {
    C sum[V] = {};
    for (int32_t ih = p.row_begin(oh); ih < p.row_end(oh); ++ih)
      for (int32_t iw = p.col_begin(ow); iw < p.col_end(ow); ++iw) {
        const Pack<T, V> xs = load_pack<V>(x + static_cast<uint32_t>(in.at(cell.n, cell.c, ih, iw)) * V);
#pragma unroll
        for (int k = 0; k < V; ++k) sum[k] += convert_to<C>(xs.v[k]);
      }
    const C divisor = static_cast<C>(p.divisor(oh, ow));
#pragma unroll
    for (int k = 0; k < V; ++k) result.v[k] = convert_to<T>(sum[k] / divisor);
  }
  store_pack(y + o * V, result);
}

template <typename T, int V, typename I>
__global__ void pool_backward_kernel(const T* gy, const I* indices, T* dx, Windows p, Layout in, Layout out,
                                     uint32_t total) {
  wait_for_previous_grid();
  allow_next_grid_to_start();
  using C = compute_t<T>;
  const uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= total) return;
  const Layout::Cell cell = in.cell(i);
  Pack<T, V> result;
  if (!indices && p.adaptive && p.OH == 1 && p.OW == 1) {  // global average pooling: one window
    const Pack<T, V> g = load_pack<V>(gy + static_cast<uint32_t>(out.at(cell.n, cell.c, 0, 0)) * V);
#pragma unroll
    for (int k = 0; k < V; ++k) result.v[k] = convert_to<T>(convert_to<C>(g.v[k]) / static_cast<C>(p.H * p.W));
    store_pack(dx + i * V, result);
    return;
  }
  const int32_t ih = cell.h, iw = cell.w;
  C acc[V] = {};
  for (int32_t oh = p.out_row_begin(ih); oh < p.out_row_end(ih); ++oh)
    for (int32_t ow = p.out_col_begin(iw); ow < p.out_col_end(iw); ++ow) {
      const uint32_t o = static_cast<uint32_t>(out.at(cell.n, cell.c, oh, ow)) * V;
      if (indices) {
        const Pack<I, V> where = load_pack<V>(indices + o);
        const Pack<T, V> g = load_pack<V>(gy + o);
        const int32_t place = p.place_in_window(oh, ow, ih, iw);
#pragma unroll
        for (int k = 0; k < V; ++k)
          if (static_cast<int32_t>(where.v[k]) == place) acc[k] += convert_to<C>(g.v[k]);
      } else if (!p.adaptive || p.covers(oh, ow, ih, iw)) {
        const Pack<T, V> g = load_pack<V>(gy + o);
        const C divisor = static_cast<C>(p.divisor(oh, ow));
#pragma unroll
        for (int k = 0; k < V; ++k) acc[k] += convert_to<C>(g.v[k]) / divisor;
      }
    }
#pragma unroll
  for (int k = 0; k < V; ++k) result.v[k] = convert_to<T>(acc[k]);
  store_pack(dx + i * V, result);
}

// The layouts of x and y as a kernel of V channels a thread sees them.
Layout input_layout(const PoolWindows& p, MemoryFormat format, int V) {
  return {p.C / V, p.H, p.W, format == MemoryFormat::channels_last};
}
Layout output_layout(const PoolWindows& p, MemoryFormat format, int V) {
  return {p.C / V, p.OH, p.OW, format == MemoryFormat::channels_last};
}

// The channels a thread takes: a 16-byte pack of them where the layout is channels-last, C a
// multiple of the pack and every operand (indices: as many int32s) starts on a pack; else one.
template <typename T, typename I>
int channels_per_thread(const PoolWindows& p, MemoryFormat format, const T* x, const T* y, const I* indices) {
  constexpr int V = Packed128<T>::size;
  const bool packs = format == MemoryFormat::channels_last && p.C % V == 0 && pack_aligned<V>(x) &&
                     pack_aligned<V>(y) && (!indices || pack_aligned<V>(indices));
  return packs ? V : 1;
}

// Calls body(Width<V>) for the V of channels_per_thread (the pack's, or 1).
template <typename T, typename Body>
void with_channels_per_thread(int V, Body&& body) {
  if (V == 1)
    body(Width<1>{});
  else
    body(Width<Packed128<T>::size>{});
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

// Calls fn(I{}) with I the element type of max pooling's `indices` (u8 or i32); average
// pooling's undefined ones take u8, unused.
template <typename Fn>
void with_index_type(const Tensor& indices, Fn&& fn) {
  if (!indices.defined() || indices.dtype() == DType::u8) {
    fn(uint8_t{});
  } else {
    PRECIS_CHECK(indices.dtype() == DType::i32, "pool2d: max pooling's indices are u8 or i32, got ",
                 dtype_name(indices.dtype()));
    fn(int32_t{});
  }
}

// Calls launch(Width<V>(), in, out, windows, x_at, y_at) for each run of samples
// (over_sample_runs), V the channels a thread takes for these operands, in and out x's and y's
// layouts as such a kernel sees them, x_at and y_at the run's first element in x and y.
template <typename T, typename I, typename Launch>
void over_launches(const PoolWindows& p, MemoryFormat format, const char* op, const T* a, const T* b, const I* indices,
                   Launch&& launch) {
  with_channels_per_thread<T>(channels_per_thread(p, format, a, b, indices), [&](auto width) {
    constexpr int V = decltype(width)::value;
    const Layout in = input_layout(p, format, V), out = output_layout(p, format, V);
    over_sample_runs(p, op, [&](const Windows& w, int64_t n0) {
      launch(width, in, out, w, n0 * p.C * p.H * p.W, n0 * p.C * p.OH * p.OW);
    });
  });
}

}  // namespace

void pool2d_forward(const Tensor& x, const Tensor& y, const Tensor& indices, const PoolWindows& p,
                    MemoryFormat format) {
  if (y.numel() == 0) return;
  const char* op = indices.defined() ? "max_pool2d" : "avg_pool2d";
  dispatch_floating(x.dtype(), "pool2d", [&](auto tag) {
    using T = typename decltype(tag)::type;
    with_index_type(indices, [&](auto index) {
      using I = decltype(index);
      const T* xs = data_of<const T>(x);
      T* ys = data_of<T>(y);
      I* where = indices.defined() ? data_of<I>(indices) : nullptr;
      over_launches(p, format, op, xs, ys, where,
                    [&](auto width, const Layout& in, const Layout& out, const Windows& w, int64_t x_at, int64_t y_at) {
                      constexpr int V = decltype(width)::value;
                      const int64_t total = static_cast<int64_t>(w.N) * p.C / V * p.OH * p.OW;
                      launch(pool_forward_kernel<T, V, I>, grid_for(total), kBlockSize, 0, stream_for(y), xs + x_at,
                             ys + y_at, where ? where + y_at : nullptr, w, in, out, static_cast<uint32_t>(total));
                    });
    });
  });
  PRECIS_CUDA_CHECK_LAUNCH(op);
}

void pool2d_backward(const Tensor& gy, const Tensor& indices, const Tensor& dx, const PoolWindows& p,
                     MemoryFormat format) {
  if (dx.numel() == 0) return;
  const char* op = indices.defined() ? "max_pool2d backward" : "avg_pool2d backward";
  dispatch_floating(dx.dtype(), "pool2d", [&](auto tag) {
    using T = typename decltype(tag)::type;
    with_index_type(indices, [&](auto index) {
      using I = decltype(index);
      const T* gys = data_of<const T>(gy);
      T* dxs = data_of<T>(dx);
      const I* where = indices.defined() ? data_of<const I>(indices) : nullptr;
      over_launches(p, format, op, gys, dxs, where,
                    [&](auto width, const Layout& in, const Layout& out, const Windows& w, int64_t x_at, int64_t y_at) {
                      constexpr int V = decltype(width)::value;
                      const int64_t total = static_cast<int64_t>(w.N) * p.C / V * p.H * p.W;
                      launch(pool_backward_kernel<T, V, I>, grid_for(total), kBlockSize, 0, stream_for(dx), gys + y_at,
                             where ? where + y_at : nullptr, dxs + x_at, w, in, out, static_cast<uint32_t>(total));
                    });
    });
  });
  PRECIS_CUDA_CHECK_LAUNCH(op);
}

}  // namespace precis::ops::cuda
