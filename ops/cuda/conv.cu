// conv2d on cuDNN (ops/cuda/conv.h): the legacy convolution API (cudnn_cnn), its three
// directions, the algorithm of each chosen once per problem and cached.
//
// The algorithm: cuDNN's heuristic (cudnnGet*Algorithm_v7) lists algorithms best first; we
// take the first that runs with a workspace of at most kMaxWorkspaceBytes. Asking the
// heuristic runs nothing on the GPU, so a first call inside a CUDA-graph capture is safe.
// The workspace comes from the caching allocator, freed (back to its cache, stream-ordered)
// when the call returns.
//
// Precision: f16/bf16 tensors with f32 accumulation (compute type float) on tensor cores;
// f32 tensors on TF32 tensor cores only where ops::allow_tf32() says so (the precision
// policy's allow_tf32, as for the products), else in plain f32 FMA.
#include <algorithm>
#include <map>
#include <mutex>
#include <vector>

#include "core/cuda/runtime.h"
#include "ops/cuda/conv.h"
#include "ops/cuda/cudnn.h"
#include "ops/matmul.h"

namespace precis::ops::cuda {

namespace {

constexpr const char* kOp = "conv2d";
constexpr size_t kMaxWorkspaceBytes = size_t(1) << 30;

enum class Direction { forward, backward_data, backward_filter };

struct AlgoKey {
  int device, dtype, format, direction;
  bool tf32;
  int64_t N, Cin, H, W, Cout, kH, kW, sh, sw, ph, pw, dh, dw, groups;
  auto operator<=>(const AlgoKey&) const = default;
};

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
    tf32 = dtype == DType::f32 && allow_tf32();
    // Plain FMA keeps f32 out of TF32; the others let the heuristic pick tensor-core algorithms.
    set_math(dtype == DType::f32 && !tf32 ? CUDNN_FMA_MATH : CUDNN_TENSOR_OP_MATH);
  }

  void set_math(cudnnMathType_t math) const {
    PRECIS_CUDNN_CHECK(cudnnSetConvolutionMathType(conv.get(), math), kOp, ": setting the math type");
  }
};

AlgoKey key_of(const Conv2dShapes& s, MemoryFormat format, DType dtype, Direction direction, bool tf32, Device device) {
  const Conv2dOptions& o = s.options;
  return {device.index,
          static_cast<int>(dtype),
          static_cast<int>(format),
          static_cast<int>(direction),
          tf32,
          s.N,
          s.Cin,
          s.H,
          s.W,
          s.Cout,
          s.kH,
          s.kW,
          o.stride[0],
          o.stride[1],
          o.padding[0],
          o.padding[1],
          o.dilation[0],
          o.dilation[1],
          o.groups};
}

// The first of the heuristic's answers that runs within the workspace bound.
template <typename Perf>
Choice first_usable(const std::vector<Perf>& perfs, int returned, const Descriptors& d) {
  for (int i = 0; i < returned; ++i) {
    const Perf& p = perfs[i];
    if (p.status != CUDNN_STATUS_SUCCESS || p.memory > kMaxWorkspaceBytes) continue;
    // f32 without TF32 stays off tensor cores, whatever the heuristic offers.
    const bool tensor_cores = p.mathType == CUDNN_TENSOR_OP_MATH || p.mathType == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION;
    if (d.dtype == DType::f32 && !d.tf32) {
      if (tensor_cores) continue;
      return {static_cast<int>(p.algo), CUDNN_FMA_MATH, p.memory};
    }
    return {static_cast<int>(p.algo), p.mathType, p.memory};
  }
  PRECIS_FAIL(kOp, ": cuDNN offers no algorithm for this convolution within a ", kMaxWorkspaceBytes >> 20,
              " MiB workspace");
}

Choice ask_heuristic(cudnnHandle_t h, const Descriptors& d, Direction direction) {
  int returned = 0;
  switch (direction) {
    case Direction::forward: {
      std::vector<cudnnConvolutionFwdAlgoPerf_t> perfs(CUDNN_CONVOLUTION_FWD_ALGO_COUNT);
      PRECIS_CUDNN_CHECK(
          cudnnGetConvolutionForwardAlgorithm_v7(h, d.x.get(), d.w.get(), d.conv.get(), d.y.get(),
                                                 static_cast<int>(perfs.size()), &returned, perfs.data()),
          kOp, ": choosing the forward algorithm");
      return first_usable(perfs, returned, d);
    }
    case Direction::backward_data: {
      std::vector<cudnnConvolutionBwdDataAlgoPerf_t> perfs(CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT);
      PRECIS_CUDNN_CHECK(
          cudnnGetConvolutionBackwardDataAlgorithm_v7(h, d.w.get(), d.y.get(), d.conv.get(), d.x.get(),
                                                      static_cast<int>(perfs.size()), &returned, perfs.data()),
          kOp, ": choosing the backward-data algorithm");
      return first_usable(perfs, returned, d);
    }
    default: {
      std::vector<cudnnConvolutionBwdFilterAlgoPerf_t> perfs(CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT);
      PRECIS_CUDNN_CHECK(
          cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, d.x.get(), d.y.get(), d.conv.get(), d.w.get(),
                                                        static_cast<int>(perfs.size()), &returned, perfs.data()),
          kOp, ": choosing the backward-filter algorithm");
      return first_usable(perfs, returned, d);
    }
  }
}

// The cached choice for this problem (asked once), with the descriptor's math type set to it.
Choice choose(cudnnHandle_t h, const Descriptors& d, const Conv2dShapes& s, MemoryFormat format, Direction direction,
              Device device) {
  const AlgoKey key = key_of(s, format, d.dtype, direction, d.tf32, device);
  Choice choice;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    auto it = g_choices.find(key);
    if (it != g_choices.end()) {
      choice = it->second;
    } else {
      choice = ask_heuristic(h, d, direction);
      g_choices.emplace(key, choice);
    }
  }
  d.set_math(choice.math);
  return choice;
}

// A workspace of `bytes` from the device's caching allocator (none for 0).
Tensor workspace(size_t bytes, Device device) {
  return bytes == 0 ? Tensor() : empty({static_cast<int64_t>(bytes)}, DType::u8, device);
}

void* data_or_null(const Tensor& t) { return t.defined() ? t.raw_data() : nullptr; }

}  // namespace

void conv2d_forward(const Tensor& x, const Tensor& w, const Tensor& y, const Conv2dShapes& s, MemoryFormat format) {
  const Device device = x.device();
  cudnnHandle_t h = cudnn::handle(device);
  Descriptors d(s, format, x.dtype());
  const Choice c = choose(h, d, s, format, Direction::forward, device);
  Tensor ws = workspace(c.workspace, device);
  PRECIS_CUDNN_CHECK(
      cudnnConvolutionForward(h, cudnn::kOne.get(), d.x.get(), x.raw_data(), d.w.get(), w.raw_data(), d.conv.get(),
                              static_cast<cudnnConvolutionFwdAlgo_t>(c.algo), data_or_null(ws), c.workspace,
                              cudnn::kZero.get(), d.y.get(), y.raw_data()),
      kOp, ": forward of ", describe(x), " with weight ", describe(w));
}

void conv2d_add_bias(const Tensor& y, const Tensor& bias, MemoryFormat format) {
  cudnnHandle_t h = cudnn::handle(y.device());
  cudnn::TensorDesc y_desc, bias_desc;
  cudnn::set_image(y_desc, y, format, kOp);
  cudnn::set_image(bias_desc, 1, bias.numel(), 1, 1, format, bias.dtype(), kOp);
  PRECIS_CUDNN_CHECK(cudnnAddTensor(h, cudnn::kOne.get(), bias_desc.get(), bias.raw_data(), cudnn::kOne.get(),
                                    y_desc.get(), y.raw_data()),
                     kOp, ": adding the bias ", describe(bias), " to ", describe(y));
}

void conv2d_backward_data(const Tensor& gy, const Tensor& w, const Tensor& dx, const Conv2dShapes& s,
                          MemoryFormat format) {
  const Device device = gy.device();
  cudnnHandle_t h = cudnn::handle(device);
  Descriptors d(s, format, gy.dtype());
  const Choice c = choose(h, d, s, format, Direction::backward_data, device);
  Tensor ws = workspace(c.workspace, device);
  PRECIS_CUDNN_CHECK(
      cudnnConvolutionBackwardData(h, cudnn::kOne.get(), d.w.get(), w.raw_data(), d.y.get(), gy.raw_data(),
                                   d.conv.get(), static_cast<cudnnConvolutionBwdDataAlgo_t>(c.algo), data_or_null(ws),
                                   c.workspace, cudnn::kZero.get(), d.x.get(), dx.raw_data()),
      kOp, ": backward-data into ", describe(dx), " with weight ", describe(w));
}

void conv2d_backward_filter(const Tensor& x, const Tensor& gy, const Tensor& dw, const Conv2dShapes& s,
                            MemoryFormat format) {
  const Device device = x.device();
  cudnnHandle_t h = cudnn::handle(device);
  Descriptors d(s, format, x.dtype());
  const Choice c = choose(h, d, s, format, Direction::backward_filter, device);
  Tensor ws = workspace(c.workspace, device);
  PRECIS_CUDNN_CHECK(
      cudnnConvolutionBackwardFilter(h, cudnn::kOne.get(), d.x.get(), x.raw_data(), d.y.get(), gy.raw_data(),
                                     d.conv.get(), static_cast<cudnnConvolutionBwdFilterAlgo_t>(c.algo),
                                     data_or_null(ws), c.workspace, cudnn::kZero.get(), d.w.get(), dw.raw_data()),
      kOp, ": backward-filter of ", describe(x), " into ", describe(dw));
}

}  // namespace precis::ops::cuda
