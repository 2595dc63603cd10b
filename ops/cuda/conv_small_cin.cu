// A network's first convolution (ops/cuda/conv_small_cin.h): 3x3, stride 1, padding 1, over an
// image of CIN = 2 to 4 channels, channels-last, in kernels of ours (a 1-channel image counts as
// NCHW, ops/memory_format.cpp, so it stays with cuDNN).
//
// Why not cuDNN: its tensor-core kernels want channels in multiples of 8, so for ResNet's CIFAR
// stem (3 channels) it first pads x and w to 8 channels (a memset and a padding kernel each),
// before the forward and again before the weight gradient, then runs a product whose reduction
// is only 72 long; the weight gradient's 262144-long reduction takes two more kernels. At B=256,
// 32x32 on an H100 that is ~49 us forward and ~48 us weight gradient, both on the step's
// critical path (bench/NOTES.md, sixteenth session), where the forward's output alone (33.5 MB)
// needs ~11 us of memory time and either direction's 0.45 G multiply-adds ~15 us of f32 FMAs.
//
// The math, with the 9 CIN taps i = (3 r + s) CIN + c (the order of a KRSC filter's row):
//   forward          y[p, k] = sum_i w[k, i] x_i(p),   p = (n, h, w) a pixel,
//                    x_i(p) = x[n, h + r - 1, w + s - 1, c], 0 outside the image;
//   weight gradient  dw[k, i] = sum_p gy[p, k] x_i(p).
// Both sum in f32 in a fixed order (the same bits every run) and round once to T.
//
// Forward: a thread per pixel holds its taps in registers; the filter sits in shared memory as
// [tap][k] in f32, so one broadcast 16-byte load gives 4 output channels' weights of a tap;
// 8 output channels are summed at a time and stored as 16-byte packs.
// Weight gradient: as many blocks as the GPU holds at once, each a run of consecutive pixels.
// A block's 256 threads are Cout / 2 channel pairs times 512 / Cout pixel groups. Tiles of 64
// pixels are staged in shared memory (each pixel's taps, padded to a multiple of 4, and its gy
// row), and a thread adds g x_i into its 2 x 9 CIN sums for the tile's pixels of its group. The
// groups' sums are added in group order into the block's partial [Cout][9 CIN]; a second kernel
// adds the blocks' partials in a fixed order and rounds.
#include <algorithm>
#include <atomic>

#include "core/copy.h"
#include "core/cuda/convert.cuh"
#include "core/cuda/dispatch.cuh"
#include "core/cuda/launch.cuh"
#include "core/cuda/pack.cuh"
#include "core/cuda/runtime.h"
#include "ops/cuda/conv_small_cin.h"

namespace precis::ops::cuda {

using namespace precis::cuda;  // the device toolkit (core/cuda/)

namespace {

constexpr const char* kOp = "conv2d";
constexpr int kTile = 64;  // pixels a weight-gradient block stages at a time

std::atomic<int64_t> g_runs{0};

// A pixel's taps, padded to a multiple of 4 (16-byte rows in shared memory).
template <int CIN>
constexpr int padded_taps() {
  return (9 * CIN + 3) / 4 * 4;
}

template <typename T, int CIN>
__global__ void __launch_bounds__(kBlockSize)
    small_cin_forward_kernel(const T* x, const T* w, T* y, int N, int H, int W, int K) {
  wait_for_previous_grid();
  allow_next_grid_to_start();
  constexpr int kTaps = 9 * CIN;
  extern __shared__ float4 filter4[];  // [kTaps][K / 4]
  float* filter = reinterpret_cast<float*>(filter4);
  // In the order of shared memory (consecutive threads, consecutive banks); w is KRSC, [k][tap].
  for (int d = threadIdx.x; d < kTaps * K; d += blockDim.x) filter[d] = convert_to<float>(w[d % K * kTaps + d / K]);
  __syncthreads();
  const int64_t pixels = static_cast<int64_t>(N) * H * W;
  const int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (p >= pixels) return;
  const int col = static_cast<int>(p % W), row = static_cast<int>(p / W % H);
  const int64_t image = p / (static_cast<int64_t>(W) * H);
  float tap[kTaps];
#pragma unroll
  for (int r = 0; r < 3; ++r) {
#pragma unroll
    for (int s = 0; s < 3; ++s) {
      const int h = row + r - 1, c0 = col + s - 1;
      const bool inside = h >= 0 && h < H && c0 >= 0 && c0 < W;
#pragma unroll
      for (int c = 0; c < CIN; ++c) {
        float v = 0.f;
        if (inside) v = convert_to<float>(x[((image * H + h) * W + c0) * CIN + c]);
        tap[(r * 3 + s) * CIN + c] = v;
      }
    }
  }
  constexpr int V = Packed128<T>::size;  // elements a 16-byte store takes: 8 (f16, bf16) or 4 (f32)
  T* out = y + p * K;
  for (int k0 = 0; k0 < K; k0 += 8) {
    float acc[8] = {};
#pragma unroll
    for (int i = 0; i < kTaps; ++i) {
      const float4 a = filter4[(i * K + k0) / 4], b = filter4[(i * K + k0) / 4 + 1];
      const float weights[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
      for (int j = 0; j < 8; ++j) acc[j] = fmaf(tap[i], weights[j], acc[j]);
    }
#pragma unroll
    for (int j = 0; j < 8; j += V) {
      Pack<T, V> v;
#pragma unroll
      for (int q = 0; q < V; ++q) v.v[q] = convert_to<T>(acc[j + q]);
      store_pack<V>(out + k0 + j, v);
    }
  }
}

// partial[b][k][i] = sum over block b's pixels p of gy[p, k] x_i(p) (the head comment's layout).
template <typename T, int CIN>
__global__ void __launch_bounds__(kBlockSize)
    small_cin_wgrad_partial_kernel(const T* x, const T* gy, float* partial, int N, int H, int W, int K,
                                   int64_t pixels_per_block) {
  wait_for_previous_grid();
  allow_next_grid_to_start();
  constexpr int kTaps = 9 * CIN, kRow = padded_taps<CIN>();
  __shared__ float4 taps4[kTile * kRow / 4];  // [kTile][kRow]: the tile's pixels' taps
  extern __shared__ float2
      dynamic2[];  // [kTile][K] the tile's gy rows; after the last tile [K][kTaps] the block's sums
  float* taps = reinterpret_cast<float*>(taps4);
  float* g_tile = reinterpret_cast<float*>(dynamic2);
  float* sums = g_tile;
  const int pairs = K / 2;
  const int k = 2 * (static_cast<int>(threadIdx.x) % pairs), group = static_cast<int>(threadIdx.x) / pairs;
  const int groups = kBlockSize / pairs;  // launched with kBlockSize threads
  float acc0[kTaps] = {}, acc1[kTaps] = {};
  const int64_t pixels = static_cast<int64_t>(N) * H * W;
  const int64_t begin = static_cast<int64_t>(blockIdx.x) * pixels_per_block;
  const int64_t end = std::min(pixels, begin + pixels_per_block);
  for (int64_t t0 = begin; t0 < end; t0 += kTile) {
    const int tile = static_cast<int>(std::min<int64_t>(kTile, end - t0));
    __syncthreads();  // the previous tile is used up
                      // Both loops have a trip count known at compile time or unrolled by 4, so each thread has
                      // several loads in flight before it waits (the tile's only latency to hide).
#pragma unroll
    for (int e = threadIdx.x; e < kTile * kRow; e += kBlockSize) {
      const int j = e / kRow, i = e % kRow;
      float v = 0.f;
      if (j < tile && i < kTaps) {
        const int64_t p = t0 + j;
        const int col = static_cast<int>(p % W), row = static_cast<int>(p / W % H);
        const int64_t image = p / (static_cast<int64_t>(W) * H);
        const int h = row + i / CIN / 3 - 1, c0 = col + i / CIN % 3 - 1;
        if (h >= 0 && h < H && c0 >= 0 && c0 < W) v = convert_to<float>(x[((image * H + h) * W + c0) * CIN + i % CIN]);
      }
      taps[e] = v;
    }
#pragma unroll 4
    for (int e = threadIdx.x; e < kTile * K; e += kBlockSize)
      g_tile[e] = e < tile * K ? convert_to<float>(gy[t0 * K + e]) : 0.f;
    __syncthreads();
    for (int j = group; j < tile; j += groups) {
      const float2 g = dynamic2[(j * K + k) / 2];
#pragma unroll
      for (int i4 = 0; i4 < kRow / 4; ++i4) {
        const float4 t = taps4[j * (kRow / 4) + i4];
        const float tv[4] = {t.x, t.y, t.z, t.w};
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          if (i4 * 4 + q < kTaps) {
            acc0[i4 * 4 + q] = fmaf(g.x, tv[q], acc0[i4 * 4 + q]);
            acc1[i4 * 4 + q] = fmaf(g.y, tv[q], acc1[i4 * 4 + q]);
          }
        }
      }
    }
  }
  // The groups' sums, added in group order into the block's [K][kTaps] (over the gy tile: the
  // first turn's barrier waits for every thread to be done with it).
  for (int turn = 0; turn < groups; ++turn) {
    __syncthreads();
    if (group == turn) {
#pragma unroll
      for (int i = 0; i < kTaps; ++i) {
        float* s0 = &sums[k * kTaps + i];
        float* s1 = &sums[(k + 1) * kTaps + i];
        *s0 = turn == 0 ? acc0[i] : *s0 + acc0[i];
        *s1 = turn == 0 ? acc1[i] : *s1 + acc1[i];
      }
    }
  }
  __syncthreads();
  for (int o = threadIdx.x; o < K * kTaps; o += blockDim.x)
    partial[static_cast<int64_t>(blockIdx.x) * K * kTaps + o] = sums[o];
}

// dw[o] = the sum over b of partial[b][o], rounded once to T. A block takes 32 outputs: its
// warp w adds the partials b = w, w + 8, ... in order, then warp 0 adds the 8 warps' sums in order.
template <typename T>
__global__ void __launch_bounds__(kBlockSize)
    small_cin_wgrad_reduce_kernel(const float* partial, int blocks, int outputs, T* dw) {
  wait_for_previous_grid();
  allow_next_grid_to_start();
  constexpr int kWarps = kBlockSize / 32;
  __shared__ float warp_sums[kWarps][32];
  const int lane = static_cast<int>(threadIdx.x) % 32, warp = static_cast<int>(threadIdx.x) / 32;
  const int o = static_cast<int>(blockIdx.x) * 32 + lane;
  float sum = 0.f;
  if (o < outputs)
    for (int b = warp; b < blocks; b += kWarps) sum += partial[static_cast<int64_t>(b) * outputs + o];
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

}  // namespace

bool small_cin_conv_applies(const Conv2dShapes& s, MemoryFormat format, DType dtype,
                            std::initializer_list<const Tensor*> buffers) {
  const Conv2dOptions& o = s.options;
  const bool power_of_two = s.Cout >= 8 && s.Cout <= 128 && (s.Cout & (s.Cout - 1)) == 0;
  if (!ops::small_cin_conv() || format != MemoryFormat::channels_last || s.Cin < 2 || s.Cin > 4 || !power_of_two ||
      o.groups != 1 || s.kH != 3 || s.kW != 3 || o.stride[0] != 1 || o.stride[1] != 1 || o.padding[0] != 1 ||
      o.padding[1] != 1 || o.dilation[0] != 1 || o.dilation[1] != 1 || s.OH != s.H || s.OW != s.W)
    return false;
  if (dtype != DType::f32 && dtype != DType::f16 && dtype != DType::bf16) return false;
  if (s.N * s.H * s.W >= (int64_t(1) << 31)) return false;  // a grid of one thread per pixel
  for (const Tensor* t : buffers)
    if (!aligned16(t->raw_data())) return false;
  return true;
}

void small_cin_conv_forward(const Tensor& x, const Tensor& w, const Tensor& y, const Conv2dShapes& s) {
  const int64_t pixels = s.N * s.H * s.W;
  if (pixels == 0) return;
  const int shared = static_cast<int>(9 * s.Cin * s.Cout * sizeof(float));
  dispatch_device<float, __half, __nv_bfloat16>(
      x.dtype(),
      [&](auto tag) {
        using T = typename decltype(tag)::type;
        dispatch_cin(s.Cin, [&](auto cin) {
          launch(small_cin_forward_kernel<T, decltype(cin)::value>, grid_for(pixels), kBlockSize,
                 static_cast<size_t>(shared), stream_for(y), data_of<const T>(x), data_of<const T>(w), data_of<T>(y),
                 static_cast<int>(s.N), static_cast<int>(s.H), static_cast<int>(s.W), static_cast<int>(s.Cout));
        });
      },
      kOp, ": the small-channel kernels take float32, float16 or bfloat16, got ", x.dtype());
  PRECIS_CUDA_CHECK_LAUNCH("conv2d small-channel forward");
  ++g_runs;
}

void small_cin_conv_backward_filter(const Tensor& x, const Tensor& gy, const Tensor& dw, const Conv2dShapes& s) {
  const int64_t pixels = s.N * s.H * s.W;
  const int64_t outputs = s.Cout * 9 * s.Cin;
  const Device device = x.device();
  const int shared = static_cast<int>(std::max(kTile * s.Cout, outputs) * sizeof(float));
  if (pixels == 0) {
    fill_(dw, 0.0);
    return;
  }
  dispatch_device<float, __half, __nv_bfloat16>(
      x.dtype(),
      [&](auto tag) {
        using T = typename decltype(tag)::type;
        const cudaStream_t stream = stream_for(dw);
        dispatch_cin(s.Cin, [&](auto cin) {
          const auto kernel = small_cin_wgrad_partial_kernel<T, decltype(cin)::value>;
          // As many blocks as the GPU holds at once, each a run of whole tiles (at least one).
          const int64_t target =
              static_cast<int64_t>(resident_blocks_per_sm(reinterpret_cast<const void*>(kernel), kBlockSize)) *
              multiprocessor_count(device);
          const int64_t per_block = (std::max<int64_t>(1, (pixels + target - 1) / target) + kTile - 1) / kTile * kTile;
          const int64_t blocks = (pixels + per_block - 1) / per_block;
          const Tensor partial = empty({blocks, outputs}, DType::f32, device);
          launch(kernel, dim3(static_cast<unsigned>(blocks)), kBlockSize, static_cast<size_t>(shared), stream,
                 data_of<const T>(x), data_of<const T>(gy), data_of<float>(partial), static_cast<int>(s.N),
                 static_cast<int>(s.H), static_cast<int>(s.W), static_cast<int>(s.Cout), per_block);
          PRECIS_CUDA_CHECK_LAUNCH("conv2d small-channel weight gradient (partial sums)");
          launch(small_cin_wgrad_reduce_kernel<T>, dim3(static_cast<unsigned>((outputs + 31) / 32)), kBlockSize, 0,
                 stream, data_of<const float>(partial), static_cast<int>(blocks), static_cast<int>(outputs),
                 data_of<T>(dw));
        });
      },
      kOp, ": the small-channel kernels take float32, float16 or bfloat16, got ", x.dtype());
  PRECIS_CUDA_CHECK_LAUNCH("conv2d small-channel weight gradient (sum of the blocks)");
  ++g_runs;
}

int64_t small_cin_conv_runs() { return g_runs.load(); }

}  // namespace precis::ops::cuda
