// conv2d: a 2-D cross-correlation over the spatial dims of [N, C, H, W] tensors, in groups.
// With x [N, Cin, H, W], weight [Cout, Cin/G, kH, kW] and G groups of Cg = Cin/G input and
// Cog = Cout/G output channels, output channel co of group g = co / Cog reads input channels
// [g Cg, (g + 1) Cg):
//   OH = (H + 2 ph - dh (kH - 1) - 1) / sh + 1   (floor; OW alike)
//   y[n, co, oh, ow] = b[co] + sum_{c < Cg, kh, kw} w[co, c, kh, kw] x[n, g Cg + c, oh sh - ph + kh dh, ow sw - pw + kw
//   dw]
// (x is zero outside [0, H) x [0, W)). As a product: with col_n the im2col matrix of sample n
// and group g, [Cg kH kW, OH OW], whose row (c, kh, kw) holds the x value each output cell
// reads at that tap, y[n, group g] = W_g col_n + b, W_g the group's [Cog, Cg kH kW] weights.
// Gradients, with gy the output gradient (also [Cog, OH OW] per sample and group):
//   dW_g = sum_n gy[n, g] col_n^T,   db[co] = sum_{n, oh, ow} gy[n, co, oh, ow],
//   dcol_n = W_g^T gy[n, g], and dx[n] = col2im(dcol_n): each entry added back to the x
//   value it was read from.
//
// The CPU computes in f32 (f64 for f64) on contiguous NCHW copies, samples in parallel
// (OpenMP), each product one Eigen GEMM; col is rebuilt in the backward instead of saved.
// dW is summed per thread and the partial sums added in thread order (bit-exact for a
// given thread count). The GPU runs cuDNN (ops/cuda/conv.cu) in x's memory format, with
// f32 accumulation for f16/bf16. The result is in x's memory format (ops/conv.h).
//
// Under set_conv_wgrad_stream (an experiment, off by default) the GPU backward writes dW on
// the device's side stream straight into the weight's .grad, where autograd offers it
// (core/autograd.h, "Gradients written on the side stream"): forked from the compute stream
// once x and gy are ready, so that cuDNN's backward-filter runs beside the backward-data
// convolution and the batch-norm backward after it; autograd joins the streams before
// anything reads the .grad. Where no .grad is offered (a leaf without one yet), dW is returned
// as usual.
#include "ops/conv.h"

#include <omp.h>

#include <Eigen/Dense>
#include <atomic>
#include <cstdlib>
#include <string>
#include <type_traits>
#include <vector>

#include "core/autograd.h"
#include "core/copy.h"
#include "core/env_switch.h"
#include "ops/autocast.h"
#include "ops/checks.h"
#include "ops/cpu/loops.h"
#include "ops/memory_format.h"
#include "ops/op_cost.h"
#include "ops/reduce.h"

#if PRECIS_WITH_CUDA
#include "ops/cuda/conv.h"
#endif

namespace precis::ops {

namespace {

constexpr const char* kOp = "conv2d";

std::atomic<bool> g_cudnn_benchmark{true};
std::atomic<int> g_cudnn_conv_api{-1};     // a CudnnConvApi, -1 until set or read from the environment
std::atomic<int> g_conv_wgrad_stream{-1};  // 0 or 1, -1 until set or read from the environment
EnvSwitch g_small_cin_conv("PRECIS_SMALL_CIN_CONV", /*default_on=*/true);

struct Geometry {
  int64_t N, Cin, H, W, Cout, kH, kW, OH, OW, groups;
  std::array<int64_t, 2> stride, padding, dilation;
  int64_t Cg() const { return Cin / groups; }
  int64_t Cog() const { return Cout / groups; }
  int64_t K() const { return Cg() * kH * kW; }  // rows of col
  int64_t L() const { return OH * OW; }         // columns of col
};

Geometry geometry(const Tensor& x, const Tensor& weight, const Tensor& bias, const Conv2dOptions& o) {
  require_image(kOp, x);
  require_image(kOp, weight, "weight");
  require_floating(kOp, x);
  PRECIS_CHECK(weight.dtype() == x.dtype(), kOp, ": weight ", describe(weight), " and input ", describe(x),
               " must have one dtype");
  Geometry g{x.shape()[0],
             x.shape()[1],
             x.shape()[2],
             x.shape()[3],
             weight.shape()[0],
             weight.shape()[2],
             weight.shape()[3],
             0,
             0,
             o.groups,
             o.stride,
             o.padding,
             o.dilation};
  for (int i = 0; i < 2; ++i) {
    PRECIS_CHECK(o.stride[i] >= 1 && o.dilation[i] >= 1 && o.padding[i] >= 0, kOp,
                 ": stride and dilation must be >= 1 and padding >= 0, got stride {", o.stride[0], ", ", o.stride[1],
                 "}, padding {", o.padding[0], ", ", o.padding[1], "}, dilation {", o.dilation[0], ", ", o.dilation[1],
                 "}");
  }
  PRECIS_CHECK(g.groups >= 1 && g.Cin % g.groups == 0 && g.Cout % g.groups == 0, kOp, ": groups (", g.groups,
               ") must divide the input channels (", g.Cin, ") and the output channels (", g.Cout, ")");
  PRECIS_CHECK(weight.shape()[1] == g.Cg(), kOp, ": weight ", describe(weight),
               " must be [Cout, Cin / groups = ", g.Cg(), ", kH, kW] for input ", describe(x), " and ", g.groups,
               " groups");
  const int64_t extent_h = g.dilation[0] * (g.kH - 1) + 1, extent_w = g.dilation[1] * (g.kW - 1) + 1;
  const int64_t padded_h = g.H + 2 * g.padding[0], padded_w = g.W + 2 * g.padding[1];
  PRECIS_CHECK(padded_h >= extent_h && padded_w >= extent_w, kOp, ": the kernel (", g.kH, "x", g.kW, " dilated to ",
               extent_h, "x", extent_w, ") is larger than the padded input (", padded_h, "x", padded_w, ") of ",
               describe(x));
  g.OH = (padded_h - extent_h) / g.stride[0] + 1;
  g.OW = (padded_w - extent_w) / g.stride[1] + 1;
  if (bias.defined()) {
    PRECIS_CHECK(bias.dtype() == x.dtype(), kOp, ": bias ", describe(bias), " and input ", describe(x),
                 " must have one dtype");
    PRECIS_CHECK(bias.shape() == Shape{g.Cout}, kOp, ": bias must be [", g.Cout, "], got ", describe(bias));
  }
  return g;
}

using Eigen::Dynamic;
template <typename A>
using Matrix = Eigen::Map<Eigen::Matrix<A, Dynamic, Dynamic, Eigen::RowMajor>>;
template <typename A>
using ConstMatrix = Eigen::Map<const Eigen::Matrix<A, Dynamic, Dynamic, Eigen::RowMajor>>;

// Calls fn(row of col, oh, c, ih, first ow, last ow + 1, iw of ow = 0) for every (c, kh, kw, oh) whose
// input row ih is inside x; fn handles the columns ow of that row whose iw is inside too.
template <typename Fn>
void for_each_tap_row(const Geometry& g, Fn fn) {
  const int64_t sw = g.stride[1], pw = g.padding[1];
  for (int64_t c = 0; c < g.Cg(); ++c)
    for (int64_t kh = 0; kh < g.kH; ++kh)
      for (int64_t kw = 0; kw < g.kW; ++kw) {
        const int64_t row = (c * g.kH + kh) * g.kW + kw;
        const int64_t iw0 = kw * g.dilation[1] - pw;  // iw at ow = 0; iw = iw0 + ow sw
        // ow with 0 <= iw0 + ow sw < W
        const int64_t ow_begin = std::min(g.OW, iw0 >= 0 ? 0 : (-iw0 + sw - 1) / sw);
        const int64_t ow_end = iw0 >= g.W ? 0 : std::min(g.OW, (g.W - iw0 + sw - 1) / sw);
        for (int64_t oh = 0; oh < g.OH; ++oh) {
          const int64_t ih = oh * g.stride[0] - g.padding[0] + kh * g.dilation[0];
          fn(row, oh, c, ih, ow_begin, std::max(ow_begin, ow_end), iw0);
        }
      }
}

// col [K, L] of one sample's group: x [Cg, H, W] (the group's channels of one sample).
template <typename A>
void im2col(const A* x, const Geometry& g, A* col) {
  const int64_t sw = g.stride[1];
  for_each_tap_row(g,
                   [&](int64_t row, int64_t oh, int64_t c, int64_t ih, int64_t ow_begin, int64_t ow_end, int64_t iw0) {
                     A* out = col + row * g.L() + oh * g.OW;
                     if (ih < 0 || ih >= g.H) {
                       std::fill(out, out + g.OW, A(0));
                       return;
                     }
                     const A* in = x + (c * g.H + ih) * g.W;
                     std::fill(out, out + ow_begin, A(0));
                     for (int64_t ow = ow_begin; ow < ow_end; ++ow) out[ow] = in[iw0 + ow * sw];
                     std::fill(out + ow_end, out + g.OW, A(0));
                   });
}

// dx [Cg, H, W] += col2im(dcol [K, L]).
template <typename A>
void col2im_add(const A* dcol, const Geometry& g, A* dx) {
  const int64_t sw = g.stride[1];
  for_each_tap_row(g,
                   [&](int64_t row, int64_t oh, int64_t c, int64_t ih, int64_t ow_begin, int64_t ow_end, int64_t iw0) {
                     if (ih < 0 || ih >= g.H) return;
                     const A* in = dcol + row * g.L() + oh * g.OW;
                     A* out = dx + (c * g.H + ih) * g.W;
                     for (int64_t ow = ow_begin; ow < ow_end; ++ow) out[iw0 + ow * sw] += in[ow];
                   });
}

bool parallel_over_samples(const Geometry& g) { return g.N > 1 && g.N * g.Cout * g.L() * g.K() >= kParallelGrain; }

// y [N, Cout, OH, OW] = conv(x [N, Cin, H, W], w, b); all contiguous, b may be null.
template <typename A>
void conv_forward(const A* x, const A* w, const A* b, A* y, const Geometry& g) {
  const int64_t K = g.K(), L = g.L(), Cog = g.Cog();
#pragma omp parallel for schedule(static) if (parallel_over_samples(g))
  for (int64_t n = 0; n < g.N; ++n) {
    A* col = cpu::scratch<A>(K * L);
    for (int64_t grp = 0; grp < g.groups; ++grp) {
      im2col(x + (n * g.Cin + grp * g.Cg()) * g.H * g.W, g, col);
      Matrix<A> out(y + (n * g.Cout + grp * Cog) * L, Cog, L);
      out.noalias() = ConstMatrix<A>(w + grp * Cog * K, Cog, K) * ConstMatrix<A>(col, K, L);
      if (b) out.colwise() += Eigen::Map<const Eigen::Vector<A, Dynamic>>(b + grp * Cog, Cog);
    }
  }
}

// dx, dw, db (each null when not wanted) from gy [N, Cout, OH, OW], x and w; dx is overwritten.
template <typename A>
void conv_backward(const A* x, const A* w, const A* gy, A* dx, A* dw, A* db, const Geometry& g) {
  const int64_t K = g.K(), L = g.L(), Cog = g.Cog(), weights = g.Cout * K;
  const bool parallel = parallel_over_samples(g);
  const int threads = parallel ? omp_get_max_threads() : 1;
  std::vector<A> dw_partial(dw ? threads * weights : 0, A(0)), db_partial(db ? threads * g.Cout : 0, A(0));
#pragma omp parallel if (parallel)
  {
    const int64_t t = omp_get_thread_num();
    A* col = cpu::scratch<A>(K * L);
    std::vector<A> dcol(dx ? K * L : 0);
#pragma omp for schedule(static)
    for (int64_t n = 0; n < g.N; ++n) {
      if (dx) std::fill(dx + n * g.Cin * g.H * g.W, dx + (n + 1) * g.Cin * g.H * g.W, A(0));
      for (int64_t grp = 0; grp < g.groups; ++grp) {
        const A* x_group = x + (n * g.Cin + grp * g.Cg()) * g.H * g.W;
        ConstMatrix<A> grad(gy + (n * g.Cout + grp * Cog) * L, Cog, L);
        ConstMatrix<A> weight(w + grp * Cog * K, Cog, K);
        if (dw) {
          im2col(x_group, g, col);
          Matrix<A>(dw_partial.data() + t * weights + grp * Cog * K, Cog, K).noalias() +=
              grad * ConstMatrix<A>(col, K, L).transpose();
        }
        if (db) {
          Eigen::Map<Eigen::Vector<A, Dynamic>>(db_partial.data() + t * g.Cout + grp * Cog, Cog) +=
              grad.rowwise().sum();
        }
        if (dx) {
          Matrix<A>(dcol.data(), K, L).noalias() = weight.transpose() * grad;
          col2im_add(dcol.data(), g, dx + (n * g.Cin + grp * g.Cg()) * g.H * g.W);
        }
      }
    }
  }
  auto reduce_partials = [threads](const std::vector<A>& partial, int64_t count, A* out) {
    for (int64_t j = 0; j < count; ++j) {
      A total = 0;
      for (int t = 0; t < threads; ++t) total += partial[t * count + j];
      out[j] = total;
    }
  };
  if (dw) reduce_partials(dw_partial, weights, dw);
  if (db) reduce_partials(db_partial, g.Cout, db);
}

// The CPU's arithmetic dtype: f64 for f64, else f32.
DType cpu_compute_dtype(DType dtype) { return dtype == DType::f64 ? DType::f64 : DType::f32; }

template <typename Fn>
void dispatch_compute(DType dtype, Fn fn) {
  if (dtype == DType::f64)
    fn(double{});
  else
    fn(float{});
}

Tensor conv_forward_cpu(const Tensor& x, const Tensor& weight, const Tensor& bias, const Geometry& g) {
  const DType A = cpu_compute_dtype(x.dtype());
  const Tensor xa = dense_in(x, MemoryFormat::contiguous, A), wa = dense(weight, A);
  const Tensor ba = bias.defined() ? dense(bias, A) : Tensor();
  Tensor y = empty({g.N, g.Cout, g.OH, g.OW}, A);
  dispatch_compute(A, [&](auto tag) {
    using T = decltype(tag);
    conv_forward<T>(xa.data<T>(), wa.data<T>(), ba.defined() ? ba.data<T>() : nullptr, y.data<T>(), g);
  });
  return dense_in(y, suggest_memory_format(x), x.dtype());
}

std::vector<Tensor> conv_backward_cpu(const Tensor& x, const Tensor& weight, const Tensor& grad, const Geometry& g,
                                      bool want_dx, bool want_dw, bool want_db) {
  const DType A = cpu_compute_dtype(x.dtype());
  const Tensor xa = dense_in(x, MemoryFormat::contiguous, A), wa = dense(weight, A);
  const Tensor ga = dense_in(grad, MemoryFormat::contiguous, A);
  Tensor dx = want_dx ? empty(x.shape(), A) : Tensor();
  Tensor dw = want_dw ? empty(weight.shape(), A) : Tensor();
  Tensor db = want_db ? empty({g.Cout}, A) : Tensor();
  dispatch_compute(A, [&](auto tag) {
    using T = decltype(tag);
    auto ptr = [](const Tensor& t) { return t.defined() ? t.data<T>() : nullptr; };
    conv_backward<T>(xa.data<T>(), wa.data<T>(), ga.data<T>(), ptr(dx), ptr(dw), ptr(db), g);
  });
  if (dx.defined()) dx = dense_in(dx, suggest_memory_format(x), x.dtype());
  if (dw.defined()) dw = dense(dw, weight.dtype());
  if (db.defined()) db = dense(db, x.dtype());
  return {dx, dw, db};
}

#if PRECIS_WITH_CUDA
cuda::Conv2dShapes shapes_of(const Geometry& g) {
  return {g.N, g.Cin, g.H, g.W, g.Cout, g.kH, g.kW, g.OH, g.OW, {g.stride, g.padding, g.dilation, g.groups}};
}

// weight: dense in x's memory format (KRSC for channels-last: cuDNN's filter layout there).
Tensor conv_forward_cuda(const Tensor& x, const Tensor& weight, const Tensor& bias, const Geometry& g) {
  const MemoryFormat format = suggest_memory_format(x);
  Tensor y = empty_in({g.N, g.Cout, g.OH, g.OW}, format, x.dtype(), x.device());
  cuda::conv2d_forward(dense_in(x, format, x.dtype()), weight, y, shapes_of(g), format);
  if (bias.defined()) cuda::conv2d_add_bias(y, dense(bias), format);
  return y;
}

std::vector<Tensor> conv_backward_cuda(const Tensor& x_saved, const Tensor& weight, const BackwardArgs& args,
                                       const Geometry& g) {
  const MemoryFormat format = suggest_memory_format(x_saved);
  const Tensor x = dense_in(x_saved, format, x_saved.dtype());
  const Tensor gy = dense_in(args.grad(), format, x.dtype());
  Tensor dx, dw, db;
  // On the side stream (conv_wgrad_stream()) dW goes first, so that it runs beside the
  // backward-data convolution too; nothing is returned for it.
  const GradDestination dw_to =
      args.needs(1) && conv_wgrad_stream() ? args.take_grad_destination_on_side_stream(1) : GradDestination{};
  if (dw_to) cuda::conv2d_backward_filter_on_side_stream(x, gy, dw_to.grad, dw_to.accumulate, shapes_of(g), format);
  if (args.needs(0)) {
    // Added by cuDNN (beta = 1) into the gradient x has gathered from its other uses where the
    // engine offers it (a residual block's input: its shortcut's gradient arrives first), which
    // saves a pass that would read both and write their sum.
    const GradDestination to = args.take_grad_destination(0, x.dtype(), x);
    dx = to ? to.grad : empty_in(x.shape(), format, x.dtype(), x.device());
    cuda::conv2d_backward_data(gy, dense_in(weight, format, x.dtype()), dx, shapes_of(g), format, to.accumulate);
    if (to) dx = Tensor();
  }
  if (args.needs(1) && !dw_to) {
    // Left in the format cuDNN writes (KRSC for channels-last): the weight's gradient is
    // converted into the parameter's dense .grad by the one copy or add that takes it there, a
    // flat one where the .grad is KRSC too (a channels-last parameter's).
    dw = empty_in(weight.shape(), format, x.dtype(), x.device());
    cuda::conv2d_backward_filter(x, gy, dw, shapes_of(g), format);
  }
  if (args.needs(2)) {
    NoGradGuard no_grad;
    db = sum(gy, {0, 2, 3});
  }
  return {dx, dw, db};
}
#endif

}  // namespace

void set_cudnn_benchmark(bool benchmark) { g_cudnn_benchmark = benchmark; }
bool cudnn_benchmark() { return g_cudnn_benchmark; }

void set_cudnn_conv_api(CudnnConvApi api) { g_cudnn_conv_api = static_cast<int>(api); }

CudnnConvApi cudnn_conv_api() {
  int api = g_cudnn_conv_api.load(std::memory_order_relaxed);
  if (api < 0) {
    const char* setting = std::getenv("PRECIS_CUDNN_CONV");
    const std::string value = setting ? setting : "graph";
    PRECIS_CHECK(value == "legacy" || value == "graph", "PRECIS_CUDNN_CONV is '", value,
                 "': set it to legacy (cuDNN's legacy convolution API) or graph (its backend API), or unset it");
    int unset = -1;
    g_cudnn_conv_api.compare_exchange_strong(
        unset, static_cast<int>(value == "graph" ? CudnnConvApi::graph : CudnnConvApi::legacy));
    api = g_cudnn_conv_api.load();
  }
  return static_cast<CudnnConvApi>(api);
}

void set_conv_wgrad_stream(bool on) { g_conv_wgrad_stream = on ? 1 : 0; }

bool conv_wgrad_stream() {
  int on = g_conv_wgrad_stream.load(std::memory_order_relaxed);
  if (on < 0) {
    const char* setting = std::getenv("PRECIS_WGRAD_STREAM");
    const std::string value = setting ? setting : "1";
    PRECIS_CHECK(value == "0" || value == "1", "PRECIS_WGRAD_STREAM is '", value,
                 "': set it to 1 (convolutions' weight gradients on the side stream, the default) or 0 (on the "
                 "compute stream), or unset it");
    int unset = -1;
    g_conv_wgrad_stream.compare_exchange_strong(unset, value == "1" ? 1 : 0);
    on = g_conv_wgrad_stream.load();
  }
  return on == 1;
}

void set_small_cin_conv(bool on) { g_small_cin_conv.set(on); }
bool small_cin_conv() { return g_small_cin_conv.on(); }

Tensor conv2d(const Tensor& x_arg, const Tensor& weight_arg, const Tensor& bias_arg, const Conv2dOptions& options) {
  // autocast: conv2d runs in the compute dtype, like matmul, and in the caller's layout (a
  // cast is written NCHW: a channels-last input's is laid out again, one more pass, paid by
  // the network's first f32 input only).
  Tensor x = autocast::to_compute(x_arg);
  if (is_channels_last(x_arg) && !is_channels_last(x)) x = to_memory_format(x, MemoryFormat::channels_last);
  const Tensor weight = autocast::to_compute(weight_arg), bias = autocast::to_compute(bias_arg);
  const Geometry g = geometry(x, weight, bias, options);
  OpScope timed(kOp, [&] {
    return cost::conv2d({g.N, g.Cin, g.H, g.W, g.Cout, g.kH, g.kW, g.OH, g.OW, g.groups, bias.defined()}, x.dtype());
  });
  common_device(kOp, {&x, &weight, &bias});
  Tensor y;
  // What the backward reads of the weight: on the GPU the weight laid out in x's memory format,
  // by the forward (a channels-last network's weights are laid out once a step, not again for the
  // backward-data convolution), or as it came where it is already (a channels-last parameter's
  // cast, nn::to_channels_last: no copy at all).
  Tensor saved_weight = weight.detach();
  if (x.is_cpu()) {
    y = conv_forward_cpu(x, weight, bias, g);
  } else {
#if PRECIS_WITH_CUDA
    saved_weight = dense_in(saved_weight, suggest_memory_format(x), x.dtype());
    y = conv_forward_cuda(x, saved_weight, bias, g);
#endif
  }
  if (autograd::any_requires_grad({&x, &weight, &bias})) {
    autograd::record(kOp, {x, weight, bias}, {y}, [x = x.detach(), weight = saved_weight, g](const BackwardArgs& args) {
      if (x.is_cpu()) return conv_backward_cpu(x, weight, args.grad(), g, args.needs(0), args.needs(1), args.needs(2));
#if PRECIS_WITH_CUDA
      return conv_backward_cuda(x, weight, args, g);
#else
                       return std::vector<Tensor>{};
#endif
    });
  }
  return y;
}

}  // namespace precis::ops
