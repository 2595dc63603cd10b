// Pooling over the spatial dims of [N, C, H, W] tensors, each (n, c) plane on its own, over
// the windows of ops/pool_window.h:
//   max:  y[oh, ow] = max over the window of x, and i[oh, ow] = the first maximum's place in the
//         window (a NaN wins, as in PyTorch; PoolWindows::place_in_window);
//                                           dx[ih, iw] = sum of gy[oh, ow] over the outputs whose i is (ih, iw)'s place
//   avg:  y[oh, ow] = sum over the window of x / divisor(oh, ow);
//                                           dx[ih, iw] = sum of gy[oh, ow] / divisor(oh, ow) over the windows holding
//                                           (ih, iw)
// Sums and comparisons in f32 for f16/bf16 (f64 for f64), rounded once. max saves its
// indices in y's layout, one byte each (u8) for windows of up to 256 cells (every ResNet's
// 3x3), else i32: PyTorch keeps i64 plane positions, 8 bytes; avg saves nothing.
//
// The CPU works on contiguous NCHW copies, planes in parallel; its backward scatters (each
// output adds into its window), which reads every output once. The CUDA kernels
// (ops/cuda/pool.cu) read and write x's memory format directly, one thread per output
// (forward) or input (backward) cell: their backward gathers (each input cell sums the
// outputs whose windows hold it), so it needs no atomics. The forwards are the same loops
// in the same order on both; the backwards add overlapping windows in different orders.
#include "ops/pool.h"

#include <cmath>
#include <limits>
#include <vector>

#include "core/autograd.h"
#include "core/copy.h"
#include "ops/checks.h"
#include "ops/cpu/loops.h"
#include "ops/memory_format.h"
#include "ops/op_cost.h"
#include "ops/pool_window.h"

#if PRECIS_WITH_CUDA
#include "ops/cuda/pool.h"
#endif

namespace precis::ops {

namespace {

template <typename T, typename I>
void pool_forward(const T* x, T* y, I* indices, const PoolWindows& p) {
  using C = compute_type_t<T>;
  const int64_t planes = p.N * p.C, in_plane = p.H * p.W, out_plane = p.OH * p.OW;
#pragma omp parallel for schedule(static) if (planes * out_plane >= kParallelGrain && planes > 1)
  for (int64_t plane = 0; plane < planes; ++plane) {
    const T* xp = x + plane * in_plane;
    for (int64_t oh = 0; oh < p.OH; ++oh)
      for (int64_t ow = 0; ow < p.OW; ++ow) {
        const int64_t o = plane * out_plane + oh * p.OW + ow;
        if (indices) {
          C best = -std::numeric_limits<C>::infinity();
          int64_t where = p.place_in_window(oh, ow, p.row_begin(oh), p.col_begin(ow));
          for (int64_t ih = p.row_begin(oh); ih < p.row_end(oh); ++ih)
            for (int64_t iw = p.col_begin(ow); iw < p.col_end(ow); ++iw) {
              const C v = convert<C>(xp[ih * p.W + iw]);
              if (v > best || std::isnan(v)) {
                best = v;
                where = p.place_in_window(oh, ow, ih, iw);
              }
            }
          y[o] = convert<T>(best);
          indices[o] = static_cast<I>(where);
        } else {
          C sum = 0;
          for (int64_t ih = p.row_begin(oh); ih < p.row_end(oh); ++ih)
            for (int64_t iw = p.col_begin(ow); iw < p.col_end(ow); ++iw) sum += convert<C>(xp[ih * p.W + iw]);
          y[o] = convert<T>(sum / static_cast<C>(p.divisor(oh, ow)));
        }
      }
  }
}

template <typename T, typename I>
void pool_backward(const T* gy, const I* indices, T* dx, const PoolWindows& p) {
  using C = compute_type_t<T>;
  const int64_t planes = p.N * p.C, in_plane = p.H * p.W, out_plane = p.OH * p.OW;
#pragma omp parallel for schedule(static) if (planes * in_plane >= kParallelGrain && planes > 1)
  for (int64_t plane = 0; plane < planes; ++plane) {
    const T* gp = gy + plane * out_plane;
    std::vector<C> acc(in_plane, C(0));
    for (int64_t oh = 0; oh < p.OH; ++oh)
      for (int64_t ow = 0; ow < p.OW; ++ow) {
        const int64_t o = oh * p.OW + ow;
        if (indices) {
          const int64_t place = indices[plane * out_plane + o];
          acc[p.row_of_place(oh, place) * p.W + p.col_of_place(ow, place)] += convert<C>(gp[o]);
          continue;
        }
        const C share = convert<C>(gp[o]) / static_cast<C>(p.divisor(oh, ow));
        for (int64_t ih = p.row_begin(oh); ih < p.row_end(oh); ++ih)
          for (int64_t iw = p.col_begin(ow); iw < p.col_end(ow); ++iw) acc[ih * p.W + iw] += share;
      }
    T* dp = dx + plane * in_plane;
    for (int64_t i = 0; i < in_plane; ++i) dp[i] = convert<T>(acc[i]);
  }
}

struct Pooled {
  Tensor y, indices;  // indices: max pooling only
};

DType pool_index_dtype(const PoolWindows& p) { return p.places_fit_a_byte() ? DType::u8 : DType::i32; }

// Calls fn(I{}) with I the element type of max pooling's indices for these windows.
template <typename Fn>
void with_index_type(const PoolWindows& p, Fn&& fn) {
  if (pool_index_dtype(p) == DType::u8)
    fn(uint8_t{});
  else
    fn(int32_t{});
}

Pooled pool_forward_cpu(const Tensor& x_in, const PoolWindows& p, bool max, const char* op) {
  const Tensor x = dense_in(x_in, MemoryFormat::contiguous, x_in.dtype());
  Tensor y = empty({p.N, p.C, p.OH, p.OW}, x.dtype());
  Tensor indices = max ? empty(y.shape(), pool_index_dtype(p)) : Tensor();
  cpu::dispatch_floating(x.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    with_index_type(p, [&](auto index) {
      using I = decltype(index);
      pool_forward<T, I>(x.data<T>(), y.data<T>(), max ? indices.data<I>() : nullptr, p);
    });
  });
  return {dense_in(y, suggest_memory_format(x_in), x.dtype()), indices};
}

Tensor pool_backward_cpu(const Tensor& grad, const Tensor& indices, const PoolWindows& p, MemoryFormat format,
                         DType dtype, const char* op) {
  const Tensor g = dense_in(grad, MemoryFormat::contiguous, dtype);
  Tensor dx = empty({p.N, p.C, p.H, p.W}, dtype);
  cpu::dispatch_floating(dtype, op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    with_index_type(p, [&](auto index) {
      using I = decltype(index);
      pool_backward<T, I>(g.data<T>(), indices.defined() ? indices.data<I>() : nullptr, dx.data<T>(), p);
    });
  });
  return dense_in(dx, format, dtype);
}

// The pooled x, with autograd: max pooling when `max`, else average pooling.
Tensor pool(const Tensor& x, const PoolWindows& p, bool max, const char* op) {
  // An adaptive window's size varies; its mean is the input over the output.
  OpScope timed(op, [&] {
    const int64_t out = p.N * p.C * p.OH * p.OW;
    const int64_t window =
        p.adaptive ? std::max<int64_t>((p.H * p.W) / std::max<int64_t>(p.OH * p.OW, 1), 1) : p.kH * p.kW;
    return cost::pool(x.numel(), out, window, max, x.dtype());
  });
  const MemoryFormat format = suggest_memory_format(x);
  Pooled out;
  if (x.is_cpu()) {
    out = pool_forward_cpu(x, p, max, op);
  } else {
#if PRECIS_WITH_CUDA
    out.y = empty_in({p.N, p.C, p.OH, p.OW}, format, x.dtype(), x.device());
    if (max) out.indices = empty_in(out.y.shape(), format, pool_index_dtype(p), x.device());
    cuda::pool2d_forward(dense_in(x, format, x.dtype()), out.y, out.indices, p, format);
#endif
  }
  if (autograd::any_requires_grad({&x})) {
    autograd::record(
        op, {x}, {out.y},
        [indices = out.indices, p, format, dtype = x.dtype(), device = x.device(), op](const BackwardArgs& g) {
          if (device.is_cpu()) return std::vector<Tensor>{pool_backward_cpu(g.grad(), indices, p, format, dtype, op)};
          Tensor dx;
#if PRECIS_WITH_CUDA
          dx = empty_in({p.N, p.C, p.H, p.W}, format, dtype, device);
          cuda::pool2d_backward(dense_in(g.grad(), format, dtype), indices, dx, p, format);
#endif
          return std::vector<Tensor>{dx};
        },
        max);
  }
  return out.y;
}

void check_input(const char* op, const Tensor& x) {
  require_image(op, x);
  require_floating(op, x);
}

// The fixed windows of max_pool2d / avg_pool2d, checked as PyTorch checks them.
PoolWindows fixed_windows(const char* op, const Tensor& x, std::array<int64_t, 2> kernel, std::array<int64_t, 2> stride,
                          std::array<int64_t, 2> padding) {
  check_input(op, x);
  if (stride[0] == 0 && stride[1] == 0) stride = kernel;
  PRECIS_CHECK(kernel[0] >= 1 && kernel[1] >= 1 && stride[0] >= 1 && stride[1] >= 1, op,
               ": kernel and stride must be >= 1, got kernel {", kernel[0], ", ", kernel[1], "}, stride {", stride[0],
               ", ", stride[1], "}");
  PRECIS_CHECK(padding[0] >= 0 && padding[1] >= 0 && 2 * padding[0] <= kernel[0] && 2 * padding[1] <= kernel[1], op,
               ": padding must be between 0 and half the kernel, got padding {", padding[0], ", ", padding[1],
               "} for kernel {", kernel[0], ", ", kernel[1], "}");
  const int64_t H = x.size(2), W = x.size(3);
  PRECIS_CHECK(H + 2 * padding[0] >= kernel[0] && W + 2 * padding[1] >= kernel[1], op, ": the kernel {", kernel[0],
               ", ", kernel[1], "} is larger than the padded input of ", describe(x));
  const int64_t OH = (H + 2 * padding[0] - kernel[0]) / stride[0] + 1;
  const int64_t OW = (W + 2 * padding[1] - kernel[1]) / stride[1] + 1;
  return {x.size(0), x.size(1), H,         W,          OH,         OW,   kernel[0],
          kernel[1], stride[0], stride[1], padding[0], padding[1], false};
}

}  // namespace

Tensor max_pool2d(const Tensor& x, std::array<int64_t, 2> kernel, std::array<int64_t, 2> stride,
                  std::array<int64_t, 2> padding) {
  return pool(x, fixed_windows("max_pool2d", x, kernel, stride, padding), true, "max_pool2d");
}

Tensor avg_pool2d(const Tensor& x, std::array<int64_t, 2> kernel, std::array<int64_t, 2> stride,
                  std::array<int64_t, 2> padding) {
  return pool(x, fixed_windows("avg_pool2d", x, kernel, stride, padding), false, "avg_pool2d");
}

Tensor adaptive_avg_pool2d(const Tensor& x, std::array<int64_t, 2> output_size) {
  const char* op = "adaptive_avg_pool2d";
  check_input(op, x);
  PRECIS_CHECK(output_size[0] >= 1 && output_size[1] >= 1, op, ": output size must be >= 1, got {", output_size[0],
               ", ", output_size[1], "}");
  PRECIS_CHECK(x.size(2) >= 1 && x.size(3) >= 1, op, ": input ", describe(x), " has no spatial cells");
  const PoolWindows p{x.size(0), x.size(1), x.size(2), x.size(3), output_size[0], output_size[1], 0, 0, 0,
                      0,         0,         0,         true};
  return pool(x, p, false, op);
}

}  // namespace precis::ops
