// conv2d on cuDNN (ops/cuda/conv.h): the legacy convolution API (cudnn_cnn), its three
// directions, the algorithm of each chosen once per problem and cached; the bias added by
// our own kernel (cudnnAddTensor's bf16 support is not documented). Under
// ops::CudnnConvApi::graph the directions run on cuDNN's graph API instead
// (ops/cuda/conv_graph.cu), a problem it has no plan for staying here.
//
// The algorithm, the first time a problem is met: with cudnn_benchmark() (on by default, as
// PyTorch's cudnn.benchmark) cuDNN times its algorithms on the call's own buffers
// (cudnnFind*AlgorithmEx) and we take the fastest that runs with a workspace of at most
// kMaxWorkspaceBytes; else, and during a CUDA-graph capture (which cannot take the timing
// runs), the first such answer of its heuristic (cudnnGet*Algorithm_v7), which runs nothing.
// The workspace comes from the caching allocator, freed (back to its cache, stream-ordered)
// when the call returns.
//
// Precision: f16/bf16 tensors with f32 accumulation (compute type float) on tensor cores;
// f32 tensors on TF32 tensor cores only where ops::allow_tf32() says so (the precision
// policy's allow_tf32, as for the products), else in plain f32 FMA.
//
// The side stream (conv2d_backward_filter_on_side_stream, ops::conv_wgrad_stream()): the
// same calls inside a SideStreamScope (core/cuda/side_stream.h), which binds the one cuDNN
// handle to the side stream for them (cudnn::handle binds it to compute_stream() at every
// call, and a graph-API plan executes on the stream of the handle it is given); workspaces
// come from the side stream's pool.
#include <algorithm>
#include <map>
#include <mutex>
#include <optional>
#include <vector>

#include "core/copy.h"
#include "core/cuda/caching_allocator.h"
#include "core/cuda/convert.cuh"
#include "core/cuda/dispatch.cuh"
#include "core/cuda/graph_memsets.h"
#include "core/cuda/launch.cuh"
#include "core/cuda/runtime.h"
#include "core/cuda/side_stream.h"
#include "ops/cuda/conv.h"
#include "ops/cuda/conv_graph.h"
#include "ops/cuda/conv_problem.h"
#include "ops/cuda/conv_small_cin.h"
#include "ops/cuda/cudnn.h"
#include "ops/memory_format.h"

namespace precis::ops::cuda {

using namespace precis::cuda;  // the device toolkit (core/cuda/)

namespace {

constexpr const char* kOp = kConvOp;

struct Choice {
  int algo;  // the direction's cudnnConvolution*Algo_t
  cudnnMathType_t math;
  size_t workspace;
};

std::mutex g_mutex;
std::map<AlgoKey, Choice> g_choices;

// The descriptors of one problem: x and y as tensors, w as a filter, the convolution.
struct Descriptors {
  cudnn::TensorDesc x, y;
  cudnn::FilterDesc w;
  cudnn::ConvolutionDesc conv;
  DType dtype;
  bool tf32;

  Descriptors(const Conv2dShapes& s, MemoryFormat format, DType dtype_) : dtype(dtype_) {
    cudnn::set_image(x, s.N, s.Cin, s.H, s.W, format, dtype, kOp);
    cudnn::set_image(y, s.N, s.Cout, s.OH, s.OW, format, dtype, kOp);
    const Conv2dOptions& o = s.options;
    PRECIS_CUDNN_CHECK(cudnnSetFilter4dDescriptor(w.get(), cudnn::data_type(dtype, kOp), cudnn::tensor_format(format),
                                                  static_cast<int>(s.Cout), static_cast<int>(s.Cin / o.groups),
                                                  static_cast<int>(s.kH), static_cast<int>(s.kW)),
                       kOp, ": describing the weight");
    PRECIS_CUDNN_CHECK(
        cudnnSetConvolution2dDescriptor(conv.get(), static_cast<int>(o.padding[0]), static_cast<int>(o.padding[1]),
                                        static_cast<int>(o.stride[0]), static_cast<int>(o.stride[1]),
                                        static_cast<int>(o.dilation[0]), static_cast<int>(o.dilation[1]),
                                        CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT),
        kOp, ": describing the convolution");
    PRECIS_CUDNN_CHECK(cudnnSetConvolutionGroupCount(conv.get(), static_cast<int>(o.groups)), kOp,
                       ": setting the group count");
    tf32 = uses_tf32(dtype);
    // Plain FMA keeps f32 out of TF32; the default math lets f32 use TF32 tensor cores; f16/bf16
    // ask for tensor cores.
    if (dtype == DType::f32)
      set_math(tf32 ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH);
    else
      set_math(CUDNN_TENSOR_OP_MATH);
  }

  void set_math(cudnnMathType_t math) const {
    PRECIS_CUDNN_CHECK(cudnnSetConvolutionMathType(conv.get(), math), kOp, ": setting the math type");
  }
};

// Whether an algorithm convolves in a transformed domain (FFT, Winograd): its transforms round
// in f32 on the way in and out, an error that grows with the filter, so a plain f32
// convolution (the fp32 policy's, the CPU reference's match) keeps to the direct and GEMM ones.
bool transform_based(cudnnConvolutionFwdAlgo_t a) {
  return a == CUDNN_CONVOLUTION_FWD_ALGO_FFT || a == CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING ||
         a == CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD || a == CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED;
}
bool transform_based(cudnnConvolutionBwdDataAlgo_t a) {
  return a == CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT || a == CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT_TILING ||
         a == CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD || a == CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD_NONFUSED;
}
bool transform_based(cudnnConvolutionBwdFilterAlgo_t a) {
  return a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT || a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT_TILING ||
         a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD_NONFUSED;
}

// The first answer (best first) that runs within the workspace bound, if any.
template <typename Perf>
std::optional<Choice> first_usable(const std::vector<Perf>& perfs, int returned, const Descriptors& d) {
  for (int i = 0; i < returned; ++i) {
    const Perf& p = perfs[i];
    if (p.status != CUDNN_STATUS_SUCCESS || p.memory > kMaxWorkspaceBytes) continue;
    // f32 without TF32 stays off tensor cores and transformed domains, whatever cuDNN offers.
    const bool tensor_cores = p.mathType == CUDNN_TENSOR_OP_MATH || p.mathType == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION;
    if (d.dtype == DType::f32 && !d.tf32) {
      if (tensor_cores || transform_based(p.algo)) continue;
      return Choice{static_cast<int>(p.algo), CUDNN_FMA_MATH, p.memory};
    }
    return Choice{static_cast<int>(p.algo), p.mathType, p.memory};
  }
  return std::nullopt;
}

// heuristic(perfs, &returned) lists the algorithms best first; with `benchmark`,
// find(perfs, &returned, workspace, bytes) runs them on the buffers (overwriting the output)
// and lists them fastest first, given the largest workspace the heuristic's usable answers need.
template <typename Perf, typename Heuristic, typename Find>
Choice pick(const Descriptors& d, int count, Device device, bool benchmark, Heuristic heuristic, Find find) {
  std::vector<Perf> perfs(count);
  int returned = 0;
  heuristic(perfs.data(), &returned);
  std::optional<Choice> choice;
  if (benchmark) {
    size_t bytes = 0;
    for (int i = 0; i < returned; ++i)
      if (perfs[i].status == CUDNN_STATUS_SUCCESS && perfs[i].memory <= kMaxWorkspaceBytes)
        bytes = std::max(bytes, perfs[i].memory);
    Tensor ws = bytes == 0 ? Tensor() : empty({static_cast<int64_t>(bytes)}, DType::u8, device);
    std::vector<Perf> timed(count);
    int found = 0;
    find(timed.data(), &found, ws.defined() ? ws.raw_data() : nullptr, bytes);
    choice = first_usable(timed, found, d);
  }
  if (!choice) choice = first_usable(perfs, returned, d);
  PRECIS_CHECK(choice.has_value(), kOp, ": cuDNN offers no algorithm for this convolution within a ",
               kMaxWorkspaceBytes >> 20, " MiB workspace");
  return *choice;
}

Choice ask(cudnnHandle_t h, const Descriptors& d, Direction direction, const Buffers& io, Device device,
           bool benchmark) {
  switch (direction) {
    case Direction::forward:
      return pick<cudnnConvolutionFwdAlgoPerf_t>(
          d, CUDNN_CONVOLUTION_FWD_ALGO_COUNT, device, benchmark,
          [&](cudnnConvolutionFwdAlgoPerf_t* perfs, int* returned) {
            PRECIS_CUDNN_CHECK(
                cudnnGetConvolutionForwardAlgorithm_v7(h, d.x.get(), d.w.get(), d.conv.get(), d.y.get(),
                                                       CUDNN_CONVOLUTION_FWD_ALGO_COUNT, returned, perfs),
                kOp, ": choosing the forward algorithm");
          },
          [&](cudnnConvolutionFwdAlgoPerf_t* perfs, int* returned, void* ws, size_t bytes) {
            PRECIS_CUDNN_CHECK(cudnnFindConvolutionForwardAlgorithmEx(
                                   h, d.x.get(), io.a, d.w.get(), io.b, d.conv.get(), d.y.get(), io.out,
                                   CUDNN_CONVOLUTION_FWD_ALGO_COUNT, returned, perfs, ws, bytes),
                               kOp, ": timing the forward algorithms");
          });
    case Direction::backward_data:
      return pick<cudnnConvolutionBwdDataAlgoPerf_t>(
          d, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, device, benchmark,
          [&](cudnnConvolutionBwdDataAlgoPerf_t* perfs, int* returned) {
            PRECIS_CUDNN_CHECK(
                cudnnGetConvolutionBackwardDataAlgorithm_v7(h, d.w.get(), d.y.get(), d.conv.get(), d.x.get(),
                                                            CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, returned, perfs),
                kOp, ": choosing the backward-data algorithm");
          },
          [&](cudnnConvolutionBwdDataAlgoPerf_t* perfs, int* returned, void* ws, size_t bytes) {
            PRECIS_CUDNN_CHECK(cudnnFindConvolutionBackwardDataAlgorithmEx(
                                   h, d.w.get(), io.a, d.y.get(), io.b, d.conv.get(), d.x.get(), io.out,
                                   CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, returned, perfs, ws, bytes),
                               kOp, ": timing the backward-data algorithms");
          });
    default:
      return pick<cudnnConvolutionBwdFilterAlgoPerf_t>(
          d, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, device, benchmark,
          [&](cudnnConvolutionBwdFilterAlgoPerf_t* perfs, int* returned) {
            PRECIS_CUDNN_CHECK(
                cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, d.x.get(), d.y.get(), d.conv.get(), d.w.get(),
                                                              CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, returned, perfs),
                kOp, ": choosing the backward-filter algorithm");
          },
          [&](cudnnConvolutionBwdFilterAlgoPerf_t* perfs, int* returned, void* ws, size_t bytes) {
            PRECIS_CUDNN_CHECK(cudnnFindConvolutionBackwardFilterAlgorithmEx(
                                   h, d.x.get(), io.a, d.y.get(), io.b, d.conv.get(), d.w.get(), io.out,
                                   CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, returned, perfs, ws, bytes),
                               kOp, ": timing the backward-filter algorithms");
          });
  }
}

// The cached choice for this problem (found once), with the descriptor's math type set to it.
// Timing the algorithms (cudnn_benchmark()) runs them on the GPU, which a CUDA-graph capture
// cannot take: a problem first met during a capture gets the heuristic's choice.
Choice choose(cudnnHandle_t h, const Descriptors& d, const Conv2dShapes& s, MemoryFormat format, Direction direction,
              const Buffers& io, Device device) {
  const bool benchmark = cudnn_benchmark();
  const AlgoKey key = key_of(s, format, d.dtype, direction, benchmark, device);
  Choice choice;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    auto it = g_choices.find(key);
    if (it != g_choices.end()) {
      choice = it->second;
    } else {
      const bool timed = may_time(benchmark);
      if (timed) quiesce_for_timing(device);
      Tensor scratch;
      choice = ask(h, d, direction, timed ? timing_buffers(io, device, scratch) : io, device, timed);
      g_choices.emplace(key, choice);
    }
  }
  d.set_math(choice.math);
  return choice;
}

// y[n, c, h, w] += bias[c], in f32 and rounded once; y dense in NCHW or channels-last.
template <typename T>
__global__ void add_bias_kernel(T* y, const T* bias, int64_t C, int64_t HW, bool channels_last, int64_t n) {
  wait_for_previous_grid();
  allow_next_grid_to_start();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const int64_t c = channels_last ? i % C : (i / HW) % C;
  y[i] = convert_to<T>(convert_to<float>(y[i]) + convert_to<float>(bias[c]));
}

// Runs one direction of the problem on `device`: on cuDNN's graph API where
// ops::cudnn_conv_api() says so and it has a plan for the problem (ops/cuda/conv_graph.cu),
// else call(handle, descriptors, choice, workspace) on the legacy API: the descriptors made,
// the algorithm chosen (cached), its workspace allocated from the device's caching
// allocator (none for 0 bytes; freed when the call returns), or in a capture a slice of its
// own (core/cuda/graph_memsets.h), as the graph API's calls take.
template <typename Call>
void run(Direction direction, const Conv2dShapes& s, MemoryFormat format, DType dtype, const Buffers& io, Device device,
         Call call) {
  if (cudnn_conv_api() == CudnnConvApi::graph && conv2d_graph(direction, s, format, dtype, io, device)) return;
  cudnnHandle_t h = cudnn::handle(device);
  Descriptors d(s, format, dtype);
  const Choice c = choose(h, d, s, format, direction, io, device);
  const precis::cuda::CaptureWorkspace slice(device, precis::cuda::compute_stream(device), c.workspace);
  Tensor ws =
      slice.data() || c.workspace == 0 ? Tensor() : empty({static_cast<int64_t>(c.workspace)}, DType::u8, device);
  call(h, d, c, slice.data() ? slice.data() : ws.defined() ? ws.raw_data() : nullptr);
}

}  // namespace

void conv2d_forward(const Tensor& x, const Tensor& w, const Tensor& y, const Conv2dShapes& s, MemoryFormat format) {
  if (small_cin_conv_applies(s, format, x.dtype(), {&x, &w, &y})) return small_cin_conv_forward(x, w, y, s);
  run(Direction::forward, s, format, x.dtype(), {x.raw_data(), w.raw_data(), y.raw_data()}, x.device(),
      [&](cudnnHandle_t h, const Descriptors& d, const Choice& c, void* ws) {
        PRECIS_CUDNN_CHECK(
            cudnnConvolutionForward(h, cudnn::kOne.get(), d.x.get(), x.raw_data(), d.w.get(), w.raw_data(),
                                    d.conv.get(), static_cast<cudnnConvolutionFwdAlgo_t>(c.algo), ws, c.workspace,
                                    cudnn::kZero.get(), d.y.get(), y.raw_data()),
            kOp, ": forward of ", describe(x), " with weight ", describe(w));
      });
}

void conv2d_add_bias(const Tensor& y, const Tensor& bias, MemoryFormat format) {
  const int64_t n = y.numel(), C = y.size(1), HW = y.size(2) * y.size(3);
  if (n == 0) return;
  dispatch_device<float, __half, __nv_bfloat16>(
      y.dtype(),
      [&](auto tag) {
        using T = typename decltype(tag)::type;
        launch(add_bias_kernel<T>, grid_for(n), kBlockSize, 0, stream_for(y), data_of<T>(y), data_of<const T>(bias), C,
               HW, format == MemoryFormat::channels_last, n);
      },
      kOp, ": the GPU path takes float32, float16 or bfloat16 tensors, got ", y.dtype());
  PRECIS_CUDA_CHECK_LAUNCH("conv2d bias");
}

void conv2d_backward_data(const Tensor& gy, const Tensor& w, const Tensor& dx, const Conv2dShapes& s,
                          MemoryFormat format, bool accumulate) {
  run(Direction::backward_data, s, format, gy.dtype(),
      {w.raw_data(), gy.raw_data(), dx.raw_data(), accumulate ? dx.nbytes() : 0}, gy.device(),
      [&](cudnnHandle_t h, const Descriptors& d, const Choice& c, void* ws) {
        PRECIS_CUDNN_CHECK(cudnnConvolutionBackwardData(
                               h, cudnn::kOne.get(), d.w.get(), w.raw_data(), d.y.get(), gy.raw_data(), d.conv.get(),
                               static_cast<cudnnConvolutionBwdDataAlgo_t>(c.algo), ws, c.workspace,
                               (accumulate ? cudnn::kOne : cudnn::kZero).get(), d.x.get(), dx.raw_data()),
                           kOp, ": backward-data into ", describe(dx), " with weight ", describe(w));
      });
}

void conv2d_backward_filter(const Tensor& x, const Tensor& gy, const Tensor& dw, const Conv2dShapes& s,
                            MemoryFormat format) {
  if (small_cin_conv_applies(s, format, x.dtype(), {&x, &gy, &dw})) return small_cin_conv_backward_filter(x, gy, dw, s);
  run(Direction::backward_filter, s, format, x.dtype(), {x.raw_data(), gy.raw_data(), dw.raw_data()}, x.device(),
      [&](cudnnHandle_t h, const Descriptors& d, const Choice& c, void* ws) {
        PRECIS_CUDNN_CHECK(
            cudnnConvolutionBackwardFilter(h, cudnn::kOne.get(), d.x.get(), x.raw_data(), d.y.get(), gy.raw_data(),
                                           d.conv.get(), static_cast<cudnnConvolutionBwdFilterAlgo_t>(c.algo), ws,
                                           c.workspace, cudnn::kZero.get(), d.w.get(), dw.raw_data()),
            kOp, ": backward-filter of ", describe(x), " into ", describe(dw));
      });
}

void conv2d_backward_filter_on_side_stream(const Tensor& x, const Tensor& gy, const Tensor& grad, bool accumulate,
                                           const Conv2dShapes& s, MemoryFormat format) {
  const Device device = x.device();
  CachingAllocator& allocator = caching_allocator(device);
  const cudaStream_t side = side_stream(device);
  if (x.numel() > 0) allocator.record_stream(x.raw_data(), side);
  if (gy.numel() > 0) allocator.record_stream(gy.raw_data(), side);
  SideStreamScope on_side(device);
  const Tensor dw = empty_in(grad.shape(), format, x.dtype(), device);
  conv2d_backward_filter(x, gy, dw, s, format);
  if (accumulate)
    accumulate_(grad, dw);
  else
    copy_(grad, dw);
}

}  // namespace precis::ops::cuda
