// A network's first convolution (ops/cuda/conv_small_cin.h): 3x3, stride 1, padding 1, over an
// image of CIN = 2 to 4 channels, channels-last, as an explicit im2col and cuBLASLt products
// instead of cuDNN's call (a 1-channel image counts as NCHW, ops/memory_format.cpp, so it stays
// with cuDNN).
//
// Why not cuDNN: its tensor-core kernels want channels in multiples of 8, so for ResNet's CIFAR
// stem (3 channels) it first pads x and w to 8 channels (a memset and a padding kernel each),
// before the forward and again before the weight gradient, then runs a product whose reduction
// is 72 long where 27 would do; the weight gradient's long reduction takes two more kernels,
// all of it on the step's critical path. A first version of ours, a thread per pixel on the f32
// FMA units, was slower still: the products belong on the tensor cores, and cuBLASLt's kernels
// for skinny products are good (the timings: bench/NOTES.md, seventeenth session).
//
// The math, with the 9 CIN taps i = (3 r + s) CIN + c (the order of a KRSC filter's row) and
// KC = 9 CIN rounded up to a multiple of 8 (16-byte rows; the extra taps are zeros):
//   im2col           cols[p, i] = x[n, h + r - 1, w + s - 1, c] (0 outside the image, and 0
//                    for i >= 9 CIN), p = (n, h, w) a pixel: a [P, KC] matrix;
//   forward          y[P, Cout] = cols wpad^T, wpad [Cout, KC] the filter with zero taps added:
//                    one product whose output is y's channels-last layout itself;
//   weight gradient  dw[k, i] = sum_p gy[p, k] cols[p, i]: the pixels cut into chunks of
//                    kChunk, one batched product gy_b^T cols_b per chunk b (f32 partials,
//                    [Cout, KC] each), then a kernel adding the partials in chunk order
//                    (the same bits every run) and rounding once to dw's dtype.
// The backward recomputes cols from x (x is 1/KC of their size), so nothing extra is saved.
#include <algorithm>
#include <atomic>

#include "core/copy.h"
#include "core/cuda/convert.cuh"
#include "core/cuda/dispatch.cuh"
#include "core/cuda/launch.cuh"
#include "core/cuda/pack.cuh"
#include "core/cuda/runtime.h"
#include "ops/cuda/conv_small_cin.h"
#include "ops/cuda/cublaslt.h"
#include "ops/cuda/matmul.h"

namespace precis::ops::cuda {

using namespace precis::cuda;  // the device toolkit (core/cuda/)

namespace {

constexpr const char* kOp = "conv2d";
// Pixels a weight-gradient partial sums: at B=256, 32x32, 256 products of [64, 1024] x [1024, 32],
// about two for each of an H100's SMs.
constexpr int64_t kChunk = 1024;

std::atomic<int64_t> g_runs{0};

// A pixel's taps rounded up to a multiple of 8: the row length of cols and of the padded filter.
constexpr int padded_taps(int cin) { return (9 * cin + 7) / 8 * 8; }

template <typename T, int CIN>
__global__ void __launch_bounds__(kBlockSize) small_cin_im2col_kernel(const T* x, T* cols, int N, int H, int W) {
  wait_for_previous_grid();
  allow_next_grid_to_start();
  constexpr int kTaps = 9 * CIN, KC = padded_taps(CIN);
  const int pixels = N * H * W;  // under 2^31 (small_cin_conv_applies)
  const int p = static_cast<int>(blockIdx.x) * blockDim.x + static_cast<int>(threadIdx.x);
  if (p >= pixels) return;
  const int col = p % W, row = p / W % H, image = p / (W * H);
  T taps[KC];
#pragma unroll
  for (int i = 0; i < KC; ++i) {
    T v = convert_to<T>(0.f);
    if (i < kTaps) {
      const int r = i / CIN / 3, s = i / CIN % 3, c = i % CIN;
      const int h = row + r - 1, w = col + s - 1;
      if (h >= 0 && h < H && w >= 0 && w < W) v = x[((static_cast<int64_t>(image) * H + h) * W + w) * CIN + c];
    }
    taps[i] = v;
  }
  constexpr int V = Packed128<T>::size;  // 8 (f16, bf16) or 4 (f32): KC is a multiple of either
  T* out = cols + static_cast<int64_t>(p) * KC;
#pragma unroll
  for (int i = 0; i < KC; i += V) {
    Pack<T, V> v;
#pragma unroll
    for (int q = 0; q < V; ++q) v.v[q] = taps[i + q];
    store_pack<V>(out + i, v);
  }
}

// wpad[k, i] = w[k, i] for i < taps, 0 after (KRSC rows widened to KC).
template <typename T>
__global__ void __launch_bounds__(kBlockSize)
    small_cin_pad_filter_kernel(const T* w, T* wpad, int cout, int taps, int kc) {
  wait_for_previous_grid();
  allow_next_grid_to_start();
  const int o = static_cast<int>(blockIdx.x) * blockDim.x + static_cast<int>(threadIdx.x);
  if (o >= cout * kc) return;
  const int k = o / kc, i = o % kc;
  wpad[o] = i < taps ? w[k * taps + i] : convert_to<T>(0.f);
}

// dw[k, i] = the sum over chunks b (in order) of partial[b][k][i], i < taps, rounded once to T.
// A block takes 32 outputs: its warp w adds the partials b = w, w + 8, ... in order, then warp 0
// adds the 8 warps' sums in order.
template <typename T>
__global__ void __launch_bounds__(kBlockSize)
    small_cin_wgrad_reduce_kernel(const float* partial, int chunks, int cout, int taps, int kc, T* dw) {
  wait_for_previous_grid();
  allow_next_grid_to_start();
  constexpr int kWarps = kBlockSize / 32;
  __shared__ float warp_sums[kWarps][32];
  const int lane = static_cast<int>(threadIdx.x) % 32, warp = static_cast<int>(threadIdx.x) / 32;
  const int o = static_cast<int>(blockIdx.x) * 32 + lane;
  const int outputs = cout * taps;
  const int64_t at = static_cast<int64_t>(o / taps) * kc + o % taps;  // (k, i) in a [Cout, KC] partial
  float sum = 0.f;
  if (o < outputs)
    for (int b = warp; b < chunks; b += kWarps) sum += partial[static_cast<int64_t>(b) * cout * kc + at];
  warp_sums[warp][lane] = sum;
  __syncthreads();
  if (warp == 0 && o < outputs) {
    float total = 0.f;
    for (int w = 0; w < kWarps; ++w) total += warp_sums[w][lane];
    dw[o] = convert_to<T>(total);
  }
}

// fn(Int<CIN>) for the problem's input channels (2 to 4).
template <typename Fn>
void dispatch_cin(int64_t cin, Fn&& fn) {
  switch (cin) {
    case 2:
      return fn(std::integral_constant<int, 2>{});
    case 3:
      return fn(std::integral_constant<int, 3>{});
    default:
      return fn(std::integral_constant<int, 4>{});
  }
}

// cols [P, KC] of x (the head comment's im2col), a new tensor of x's dtype on the compute stream.
Tensor im2col(const Tensor& x, const Conv2dShapes& s) {
  const int64_t pixels = s.N * s.H * s.W;
  const Tensor cols = empty({pixels, padded_taps(static_cast<int>(s.Cin))}, x.dtype(), x.device());
  dispatch_device<float, __half, __nv_bfloat16>(
      x.dtype(),
      [&](auto tag) {
        using T = typename decltype(tag)::type;
        dispatch_cin(s.Cin, [&](auto cin) {
          launch(small_cin_im2col_kernel<T, decltype(cin)::value>, grid_for(pixels), kBlockSize, 0, stream_for(cols),
                 data_of<const T>(x), data_of<T>(cols), static_cast<int>(s.N), static_cast<int>(s.H),
                 static_cast<int>(s.W));
        });
      },
      kOp, ": the small-channel path takes float32, float16 or bfloat16, got ", x.dtype());
  PRECIS_CUDA_CHECK_LAUNCH("conv2d small-channel im2col");
  return cols;
}

}  // namespace

bool small_cin_conv_applies(const Conv2dShapes& s, MemoryFormat format, DType dtype,
                            std::initializer_list<const Tensor*> buffers) {
  const Conv2dOptions& o = s.options;
  if (!ops::small_cin_conv() || format != MemoryFormat::channels_last || s.Cin < 2 || s.Cin > 4 || s.Cout % 8 != 0 ||
      o.groups != 1 || s.kH != 3 || s.kW != 3 || o.stride[0] != 1 || o.stride[1] != 1 || o.padding[0] != 1 ||
      o.padding[1] != 1 || o.dilation[0] != 1 || o.dilation[1] != 1 || s.OH != s.H || s.OW != s.W)
    return false;
  if (dtype != DType::f32 && dtype != DType::f16 && dtype != DType::bf16) return false;
  if (s.N * s.H * s.W >= (int64_t(1) << 31)) return false;  // 32-bit pixel indices
  for (const Tensor* t : buffers)
    if (!aligned16(t->raw_data())) return false;
  return true;
}

void small_cin_conv_forward(const Tensor& x, const Tensor& w, const Tensor& y, const Conv2dShapes& s) {
  const int64_t pixels = s.N * s.H * s.W;
  if (pixels == 0) return;
  const int taps = static_cast<int>(9 * s.Cin), kc = padded_taps(static_cast<int>(s.Cin));
  const Tensor cols = im2col(x, s);
  const Tensor wpad = empty({s.Cout, kc}, w.dtype(), w.device());
  dispatch_device<float, __half, __nv_bfloat16>(
      w.dtype(),
      [&](auto tag) {
        using T = typename decltype(tag)::type;
        launch(small_cin_pad_filter_kernel<T>, grid_for(s.Cout * kc), kBlockSize, 0, stream_for(wpad),
               data_of<const T>(w), data_of<T>(wpad), static_cast<int>(s.Cout), taps, kc);
      },
      kOp, ": the small-channel path takes float32, float16 or bfloat16, got ", w.dtype());
  PRECIS_CUDA_CHECK_LAUNCH("conv2d small-channel filter padding");
  // y, dense channels-last, is the row-major [P, Cout] the product writes.
  linear(y.as_strided({pixels, s.Cout}, {s.Cout, 1}, y.offset()), cols, wpad, Tensor());
  ++g_runs;
}

void small_cin_conv_backward_filter(const Tensor& x, const Tensor& gy, const Tensor& dw, const Conv2dShapes& s) {
  const int64_t pixels = s.N * s.H * s.W;
  if (pixels == 0) {
    fill_(dw, 0.0);
    return;
  }
  const int64_t taps = 9 * s.Cin, kc = padded_taps(static_cast<int>(s.Cin));
  const Device device = x.device();
  const Tensor cols = im2col(x, s);
  const int64_t full = pixels / kChunk, rest = pixels % kChunk, chunks = full + (rest > 0 ? 1 : 0);
  const Tensor partial = empty({chunks, s.Cout, kc}, DType::f32, device);
  // partial[b] = gy_b^T cols_b, in cuBLASLt's column-major terms (ops/cuda/cublaslt.h): the
  // row-major [Cout, KC] partial read column-major is its transpose, cols_b^T gy_b, with m = KC,
  // n = Cout, k = the chunk's pixels; cols_b row-major is cols_b^T column-major (no transpose),
  // gy_b row-major [k, Cout] is gy_b^T column-major, so it goes in transposed.
  auto product = [&](int64_t first_chunk, int64_t batch, int64_t rows) {
    cublaslt::Gemm g;
    g.op = "conv2d small-channel weight gradient";
    g.device = device;
    g.dtype = x.dtype();
    g.out_dtype = DType::f32;
    g.m = kc;
    g.n = s.Cout;
    g.k = rows;
    g.batch = batch;
    g.a = static_cast<const char*>(cols.raw_data()) + first_chunk * kChunk * kc * element_size(x.dtype());
    g.lda = kc;
    g.stride_a = kChunk * kc;
    g.b = static_cast<const char*>(gy.raw_data()) + first_chunk * kChunk * s.Cout * element_size(x.dtype());
    g.trans_b = true;
    g.ldb = s.Cout;
    g.stride_b = kChunk * s.Cout;
    g.d = data_of<float>(partial) + first_chunk * s.Cout * kc;
    g.ldd = kc;
    g.stride_d = s.Cout * kc;
    cublaslt::run(g);
  };
  if (full > 0) product(0, full, kChunk);
  if (rest > 0) product(full, 1, rest);
  const int64_t outputs = s.Cout * taps;
  dispatch_device<float, __half, __nv_bfloat16>(
      x.dtype(),
      [&](auto tag) {
        using T = typename decltype(tag)::type;
        launch(small_cin_wgrad_reduce_kernel<T>, dim3(static_cast<unsigned>((outputs + 31) / 32)), kBlockSize, 0,
               stream_for(dw), data_of<const float>(partial), static_cast<int>(chunks), static_cast<int>(s.Cout),
               static_cast<int>(taps), static_cast<int>(kc), data_of<T>(dw));
      },
      kOp, ": the small-channel path takes float32, float16 or bfloat16, got ", x.dtype());
  PRECIS_CUDA_CHECK_LAUNCH("conv2d small-channel weight gradient (sum of the chunks)");
  ++g_runs;
}

int64_t small_cin_conv_runs() { return g_runs.load(); }

}  // namespace precis::ops::cuda
