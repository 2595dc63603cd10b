// conv2d on cuDNN's graph (backend) API (ops/cuda/conv_graph.h): each direction built as a
// one-operation graph, its engine configurations asked of cuDNN's heuristics, the usable ones
// turned into execution plans, and, with cudnn_benchmark(), the fastest of them on this GPU
// kept per problem, as PyTorch does (through cudnn-frontend, which is not a dependency here:
// these are the raw cudnnBackend* calls it makes).
//
// The objects, each a backend descriptor set attribute by attribute and then finalized:
//   tensor      x [N, Cin, H, W], w [Cout, Cin/G, kH, kW], y [N, Cout, OH, OW]: dims always in
//               NCHW order, strides saying the layout (channels-last: NHWC memory, the weight
//               KRSC), a unique id by which the variant pack later gives its address, and the
//               byte alignment the kernels may assume (that of the address, at most 16). The
//               groups G are implied: x has Cin channels, w's second dim Cin/G.
//   convolution the geometry: 2 spatial dims, cross-correlation, pre- and post-paddings (both
//               the padding: PyTorch's symmetric one), strides, dilations; compute type f32
//               (f16/bf16 data accumulate in f32).
//   operation   forward y = alpha conv(x, w) + beta y; backward-data dx = alpha conv^T(dy, w)
//               + beta dx; backward-filter dw = alpha (dy correlated with x) + beta dw. alpha = 1,
//               beta = 0, or beta = 1 for backward-data's accumulate (conv2d_backward_data adds
//               into the gradient x has already gathered), so beta is part of the problem.
//   graph       the one operation.
//   engine      one of cuDNN's implementations of the graph (a kernel family, with notes on its
//               numerics: tensor cores, inputs converted down, FFT, Winograd, runtime-compiled).
//   engine config  an engine with its knobs set (tile sizes, split-k, ...): what the
//               heuristics return, best first. Mode A is the heuristic PyTorch uses by
//               default; FALLBACK lists engines that run almost anything, slower.
//   plan        an engine config finalized for this graph on this GPU (kernels chosen or
//               compiled); it says how many workspace bytes it needs. Finalizing fails for a
//               config that cannot run the graph here: such configs are skipped.
//   variant pack  the device addresses, by unique id, and the workspace of one execution.
//
// The choice, the first time a problem is met (then cached with its finalized plan; the
// key is conv.cu's AlgoKey plus accumulate and the three alignments):
//   - the configs of mode A, then those of FALLBACK (all of them when timing, for more to
//     choose from; else only when A gives nothing usable), in the heuristics' order;
//   - a config is skipped for its numerics: f32 with TF32 off keeps off tensor cores
//     (TENSOR_CORE), off inputs converted down (DOWN_CONVERT_INPUTS: TF32) and off the
//     transformed domains (FFT, WINOGRAD notes: their transforms round in f32 on the way in
//     and out, an error that grows with the filter, so a plain f32 convolution, the fp32
//     policy's and the CPU reference's match, keeps to the direct and GEMM ones: as the legacy
//     path). f16/bf16 take tensor-core engines, but never inputs converted further down (to
//     8 bits). No dtype takes a reduction in reduced precision (REDUCED_PRECISION_REDUCTION:
//     sums kept in f16), as ops/cuda/conv.h promises f32 accumulation. During a CUDA-graph
//     capture, runtime-compiled engines are skipped too (compiling and loading a module is no
//     work a capture can record);
//   - a config whose plan fails to finalize, or needs more than kMaxWorkspaceBytes, is
//     skipped;
//   - with cudnn_benchmark() and no capture under way, the first kBenchmarkLimit usable plans
//     of heuristic modes A, then B, then the fallback list (PyTorch's cudnn.benchmark_limit
//     is 10; more pays, bench/NOTES.md) each run on the call's own buffers (one warm-up
//     run, then the fastest of kTimedRuns runs timed by CUDA events on the compute stream; a
//     problem adding into its output times into a scratch buffer, so the real sum is left
//     alone) and the fastest is kept; a plan that fails to run is dropped. A plain-f32
//     problem also drops a plan whose output is not that of the first plan (the heuristics'
//     own choice, what runs without timing) to f32 rounding: max |out - first| above
//     kF32Agreement x max |first|. The notes do not tell every engine that rounds its inputs:
//     on an H100 one backward-filter engine without a TENSOR_CORE or DOWN_CONVERT_INPUTS note
//     gave a TF32-sized error (~1e-3 where f32 orders differ by ~1e-6) and won the timing
//     when other processes loaded the GPU (bench/NOTES.md, eighth session). Otherwise, and
//     during a capture (which cannot take the timing runs), the first usable plan, run
//     untimed.
// A problem for which no plan remains (the graph or every plan fails to finalize) is noted
// once on stderr and cached as such: conv.cu runs it on the legacy API.
//
// Each call then makes a variant pack of its buffers and a workspace from the caching
// allocator (freed, stream-ordered, when the call returns) and executes the plan on the
// handle bound to the compute stream.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "core/cuda/graph_memsets.h"
#include "core/cuda/launch.cuh"
#include "core/cuda/runtime.h"
#include "core/cuda/timed_runs.h"
#include "ops/cuda/conv_graph.h"
#include "ops/cuda/cudnn.h"
#include "ops/memory_format.h"

namespace precis::ops::cuda {

namespace {

constexpr int kBenchmarkLimit = 64;  // plans timed per problem at most
constexpr int kTimedRuns = 3;        // after one warm-up run; the fastest counts
// How far a plain-f32 plan's output may be from the first plan's, relative to the largest
// value: f32 summation orders differ by ~1e-6, inputs rounded to TF32 by ~1e-3.
constexpr double kF32Agreement = 2e-5;

// The unique ids of the three tensors, in Buffers' order (a, b, out).
constexpr int64_t kUidA = 1, kUidB = 2, kUidOut = 3;

// Owns one backend descriptor (destroyed with it), so an error thrown half-way leaks none.
class Desc {
 public:
  Desc(cudnnBackendDescriptorType_t type, const char* what) {
    PRECIS_CUDNN_CHECK(cudnnBackendCreateDescriptor(type, &desc_), kConvOp, ": creating ", what);
  }
  ~Desc() {
    if (desc_) cudnnBackendDestroyDescriptor(desc_);
  }
  Desc(Desc&& other) noexcept : desc_(std::exchange(other.desc_, nullptr)) {}
  Desc& operator=(Desc&& other) noexcept {
    std::swap(desc_, other.desc_);
    return *this;
  }
  Desc(const Desc&) = delete;
  Desc& operator=(const Desc&) = delete;

  cudnnBackendDescriptor_t get() const { return desc_; }

  // Sets one attribute: `count` values of `type` at `values`; `what` names it in errors.
  void set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, int64_t count, const void* values,
           const char* what) const {
    PRECIS_CUDNN_CHECK(cudnnBackendSetAttribute(desc_, name, type, count, values), kConvOp, ": setting ", what);
  }
  void set_descriptor(cudnnBackendAttributeName_t name, const Desc& value, const char* what) const {
    const cudnnBackendDescriptor_t raw = value.get();
    set(name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &raw, what);
  }
  void finalize(const char* what) const {
    PRECIS_CUDNN_CHECK(cudnnBackendFinalize(desc_), kConvOp, ": finalizing ", what);
  }

 private:
  cudnnBackendDescriptor_t desc_ = nullptr;
};

// The byte alignment of an address that the kernels may assume: its largest power-of-two
// divisor, at most 16 (a view into a larger buffer may start anywhere).
int64_t alignment_of(const void* p) {
  const auto address = reinterpret_cast<uintptr_t>(p);
  int64_t alignment = 1;
  while (alignment < 16 && address % (2 * alignment) == 0) alignment *= 2;
  return alignment;
}

// The key of a problem: conv.cu's, plus beta and the alignments the graph was built for.
struct GraphKey {
  AlgoKey problem;
  bool accumulate;
  int64_t align_a, align_b, align_out;
  auto operator<=>(const GraphKey&) const = default;
};

// The descriptors of one problem's graph: three tensors, the convolution, the operation and
// the graph of it; kept for as long as a plan made from them is.
struct Graph {
  std::vector<Desc> parts;
  std::optional<Desc> graph;
};

// A finalized plan, with what it was made from, and the workspace it needs.
struct Plan {
  std::shared_ptr<const Graph> graph;
  Desc config, plan;
  int64_t workspace;
};

// The attribute names of one direction's operation, each tensor by its role in the
// convolution (x the image, w the filter, y the output: forward's inputs and output, the
// backward directions' gradients of them).
struct Operation {
  cudnnBackendDescriptorType_t type;
  cudnnBackendAttributeName_t x, w, y, conv, alpha, beta;
  const char* name;
  // The unique id of each role: Buffers holds forward's x, w, y; backward-data's w, dy, dx;
  // backward-filter's x, dy, dw.
  int64_t x_uid, w_uid, y_uid;
};

Operation operation_of(Direction direction) {
  switch (direction) {
    case Direction::forward:
      return {CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR,
              CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X,
              CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W,
              CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y,
              CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC,
              CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA,
              CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA,
              "forward",
              kUidA,
              kUidB,
              kUidOut};
    case Direction::backward_data:
      return {CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA,
              "backward-data",
              kUidOut,
              kUidA,
              kUidB};
    default:
      return {CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA,
              "backward-filter",
              kUidA,
              kUidOut,
              kUidB};
  }
}

// The problem in words, for errors and notes.
std::string describe_problem(Direction direction, const Conv2dShapes& s, MemoryFormat format, DType dtype) {
  const Conv2dOptions& o = s.options;
  std::ostringstream out;
  out << operation_of(direction).name << " of x " << Shape{s.N, s.Cin, s.H, s.W} << " with weight "
      << Shape{s.Cout, s.Cin / o.groups, s.kH, s.kW} << " (stride " << o.stride[0] << "x" << o.stride[1] << ", padding "
      << o.padding[0] << "x" << o.padding[1] << ", dilation " << o.dilation[0] << "x" << o.dilation[1] << ", groups "
      << o.groups << "), " << dtype_name(dtype) << (format == MemoryFormat::channels_last ? " channels-last" : " NCHW");
  return out.str();
}

// A tensor descriptor: dims in NCHW order, strides of `format`.
Desc tensor(int64_t uid, const Shape& dims, MemoryFormat format, DType dtype, int64_t alignment) {
  Desc t(CUDNN_BACKEND_TENSOR_DESCRIPTOR, "a tensor descriptor");
  const cudnnDataType_t type = cudnn::data_type(dtype, kConvOp);
  const Shape strides = strides_of(dims, format);
  t.set(CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type, "a tensor's data type");
  t.set(CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims.data(), "a tensor's dimensions");
  t.set(CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides.data(), "a tensor's strides");
  t.set(CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid, "a tensor's unique id");
  t.set(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &alignment, "a tensor's byte alignment");
  t.finalize("a tensor descriptor");
  return t;
}

Desc convolution(const Conv2dOptions& o) {
  Desc c(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR, "the convolution descriptor");
  const cudnnDataType_t compute = CUDNN_DATA_FLOAT;
  const cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
  const int64_t spatial_dims = 2;
  c.set(CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &compute, "the convolution's compute type");
  c.set(CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, 1, &mode, "the convolution's mode");
  c.set(CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_TYPE_INT64, 1, &spatial_dims, "the convolution's spatial dims");
  c.set(CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, CUDNN_TYPE_INT64, 2, o.padding.data(), "the convolution's pre-paddings");
  c.set(CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, CUDNN_TYPE_INT64, 2, o.padding.data(), "the convolution's post-paddings");
  c.set(CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, CUDNN_TYPE_INT64, 2, o.stride.data(), "the convolution's strides");
  c.set(CUDNN_ATTR_CONVOLUTION_DILATIONS, CUDNN_TYPE_INT64, 2, o.dilation.data(), "the convolution's dilations");
  c.finalize("the convolution descriptor");
  return c;
}

// A graph and a plan name the handle they are for: its device is the GPU whose engines the
// heuristics offer and whose architecture the plan is built for. (From cuDNN 9.8 the handle
// may be left out for a device-property descriptor, made ahead of time; with neither, the
// plan is built for no GPU in particular and fails to run: CUDNN_STATUS_NOT_SUPPORTED_ARCH_MISMATCH.)
void set_handle(const Desc& d, cudnnBackendAttributeName_t name, cudnnHandle_t h) {
  d.set(name, CUDNN_TYPE_HANDLE, 1, &h, "the cuDNN handle");
}

// The graph of one direction of the problem, or the reason cuDNN's graph API rejects it.
std::shared_ptr<const Graph> build_graph(Direction direction, const Conv2dShapes& s, MemoryFormat format, DType dtype,
                                         const GraphKey& key, cudnnHandle_t h, std::string& rejected) {
  const Operation op = operation_of(direction);
  auto alignment = [&](int64_t uid) { return uid == kUidA ? key.align_a : uid == kUidB ? key.align_b : key.align_out; };
  auto g = std::make_shared<Graph>();
  g->parts.push_back(tensor(op.x_uid, {s.N, s.Cin, s.H, s.W}, format, dtype, alignment(op.x_uid)));
  g->parts.push_back(
      tensor(op.w_uid, {s.Cout, s.Cin / s.options.groups, s.kH, s.kW}, format, dtype, alignment(op.w_uid)));
  g->parts.push_back(tensor(op.y_uid, {s.N, s.Cout, s.OH, s.OW}, format, dtype, alignment(op.y_uid)));
  g->parts.push_back(convolution(s.options));
  const Desc& x = g->parts[0];
  const Desc& w = g->parts[1];
  const Desc& y = g->parts[2];
  const Desc& conv = g->parts[3];

  Desc operation(op.type, "the convolution operation");
  const float alpha = 1.0f, beta = key.accumulate ? 1.0f : 0.0f;
  operation.set_descriptor(op.x, x, "the operation's x");
  operation.set_descriptor(op.w, w, "the operation's w");
  operation.set_descriptor(op.y, y, "the operation's y");
  operation.set_descriptor(op.conv, conv, "the operation's convolution");
  operation.set(op.alpha, CUDNN_TYPE_FLOAT, 1, &alpha, "the operation's alpha");
  operation.set(op.beta, CUDNN_TYPE_FLOAT, 1, &beta, "the operation's beta");
  operation.finalize("the convolution operation");
  g->parts.push_back(std::move(operation));

  Desc graph(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, "the operation graph");
  const cudnnBackendDescriptor_t ops[] = {g->parts.back().get()};
  graph.set(CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, ops, "the graph's operations");
  set_handle(graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, h);
  // A graph cuDNN cannot take (a geometry no engine supports) is no error of ours.
  if (const cudnnStatus_t status = cudnnBackendFinalize(graph.get()); status != CUDNN_STATUS_SUCCESS) {
    rejected = std::string("the operation graph does not finalize: ") + cudnnGetErrorString(status);
    return nullptr;
  }
  g->graph.emplace(std::move(graph));
  return g;
}

// The engine configs the heuristic of `mode` offers for the graph, best first (none where the
// mode has nothing for it).
std::vector<Desc> engine_configs(const Graph& g, cudnnBackendHeurMode_t mode) {
  Desc heuristic(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, "the engine heuristic");
  heuristic.set_descriptor(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, *g.graph, "the heuristic's graph");
  heuristic.set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode, "the heuristic's mode");
  if (cudnnBackendFinalize(heuristic.get()) != CUDNN_STATUS_SUCCESS) return {};
  int64_t count = 0;
  PRECIS_CUDNN_CHECK(cudnnBackendGetAttribute(heuristic.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                              CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, nullptr),
                     kConvOp, ": counting the heuristic's engine configs");
  std::vector<Desc> configs;
  std::vector<cudnnBackendDescriptor_t> raw;
  for (int64_t i = 0; i < count; ++i) {
    configs.emplace_back(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, "an engine config");
    raw.push_back(configs.back().get());
  }
  int64_t returned = 0;
  if (count > 0)
    PRECIS_CUDNN_CHECK(cudnnBackendGetAttribute(heuristic.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                                CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &returned, raw.data()),
                       kConvOp, ": reading the heuristic's engine configs");
  configs.erase(configs.begin() + std::clamp<int64_t>(returned, 0, count), configs.end());
  return configs;
}

// The numerical and behaviour notes of a config's engine.
struct Notes {
  std::vector<cudnnBackendNumericalNote_t> numerical;
  std::vector<cudnnBackendBehaviorNote_t> behavior;

  bool has(cudnnBackendNumericalNote_t note) const {
    return std::find(numerical.begin(), numerical.end(), note) != numerical.end();
  }
  bool has(cudnnBackendBehaviorNote_t note) const {
    return std::find(behavior.begin(), behavior.end(), note) != behavior.end();
  }
};

// The notes of `config`'s engine; none where cuDNN cannot say (the config is then skipped).
std::optional<Notes> notes_of(const Desc& config) {
  Desc engine(CUDNN_BACKEND_ENGINE_DESCRIPTOR, "an engine descriptor");
  cudnnBackendDescriptor_t raw = engine.get();
  int64_t n = 0;
  if (cudnnBackendGetAttribute(config.get(), CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n, &raw) !=
      CUDNN_STATUS_SUCCESS)
    return std::nullopt;
  Notes notes;
  notes.numerical.resize(CUDNN_NUMERICAL_NOTE_TYPE_COUNT);
  notes.behavior.resize(CUDNN_BEHAVIOR_NOTE_TYPE_COUNT);
  if (cudnnBackendGetAttribute(engine.get(), CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                               CUDNN_NUMERICAL_NOTE_TYPE_COUNT, &n, notes.numerical.data()) != CUDNN_STATUS_SUCCESS)
    return std::nullopt;
  notes.numerical.resize(std::clamp<int64_t>(n, 0, CUDNN_NUMERICAL_NOTE_TYPE_COUNT));
  if (cudnnBackendGetAttribute(engine.get(), CUDNN_ATTR_ENGINE_BEHAVIOR_NOTE, CUDNN_TYPE_BEHAVIOR_NOTE,
                               CUDNN_BEHAVIOR_NOTE_TYPE_COUNT, &n, notes.behavior.data()) != CUDNN_STATUS_SUCCESS)
    return std::nullopt;
  notes.behavior.resize(std::clamp<int64_t>(n, 0, CUDNN_BEHAVIOR_NOTE_TYPE_COUNT));
  return notes;
}

// Whether an engine with these notes may run the problem (the head comment says why).
bool numerics_allowed(const Notes& notes, DType dtype, bool tf32, bool capturing) {
  if (capturing && notes.has(CUDNN_BEHAVIOR_NOTE_RUNTIME_COMPILATION)) return false;
  if (notes.has(CUDNN_NUMERICAL_NOTE_REDUCED_PRECISION_REDUCTION)) return false;
  const bool plain_f32 = dtype == DType::f32 && !tf32;
  if (!(dtype == DType::f32 && tf32) && notes.has(CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS)) return false;
  if (plain_f32 &&
      (notes.has(CUDNN_NUMERICAL_NOTE_TENSOR_CORE) || notes.has(CUDNN_NUMERICAL_NOTE_FFT) ||
       notes.has(CUDNN_NUMERICAL_NOTE_WINOGRAD) || notes.has(CUDNN_NUMERICAL_NOTE_WINOGRAD_TILE_4x4) ||
       notes.has(CUDNN_NUMERICAL_NOTE_WINOGRAD_TILE_6x6) || notes.has(CUDNN_NUMERICAL_NOTE_WINOGRAD_TILE_13x13)))
    return false;
  return true;
}

// What became of the configs the heuristics offered, for the note when none is usable.
struct Tally {
  int offered = 0, numerics = 0, unfinalized = 0, too_large = 0;
  cudnnStatus_t first_failure = CUDNN_STATUS_SUCCESS;

  std::string describe() const {
    std::ostringstream out;
    out << "no engine config of its heuristics gives a usable plan: " << offered << " offered, " << numerics
        << " skipped for their numerics, " << unfinalized << " failed to finalize";
    if (unfinalized > 0) out << " (the first: " << cudnnGetErrorString(first_failure) << ")";
    out << ", " << too_large << " needing over " << (kMaxWorkspaceBytes >> 20) << " MiB of workspace";
    return out.str();
  }
};

// The plan of `config` for the graph, or none where it does not finalize here or needs more
// than kMaxWorkspaceBytes (counted in `tally`).
std::optional<Plan> plan_of(Desc config, const std::shared_ptr<const Graph>& g, cudnnHandle_t h, Tally& tally) {
  Desc plan(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, "an execution plan");
  plan.set_descriptor(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, config, "the plan's engine config");
  set_handle(plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, h);
  if (const cudnnStatus_t status = cudnnBackendFinalize(plan.get()); status != CUDNN_STATUS_SUCCESS) {
    if (tally.unfinalized++ == 0) tally.first_failure = status;
    return std::nullopt;
  }
  int64_t workspace = 0, n = 0;
  PRECIS_CUDNN_CHECK(cudnnBackendGetAttribute(plan.get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1,
                                              &n, &workspace),
                     kConvOp, ": reading a plan's workspace size");
  if (workspace < 0 || static_cast<size_t>(workspace) > kMaxWorkspaceBytes) {
    ++tally.too_large;
    return std::nullopt;
  }
  return Plan{g, std::move(config), std::move(plan), workspace};
}

// Runs `plan` on the buffers with `workspace` (at least plan.workspace bytes); cuDNN's status.
cudnnStatus_t execute(cudnnHandle_t h, const Plan& plan, const Buffers& io, void* workspace) {
  Desc pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, "the variant pack");
  const int64_t uids[] = {kUidA, kUidB, kUidOut};
  void* pointers[] = {const_cast<void*>(io.a), const_cast<void*>(io.b), io.out};
  pack.set(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, 3, uids, "the variant pack's unique ids");
  pack.set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, 3, pointers, "the variant pack's pointers");
  pack.set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace, "the variant pack's workspace");
  pack.finalize("the variant pack");
  return cudnnBackendExecute(h, plan.plan.get(), pack.get());
}

Tensor workspace_tensor(int64_t bytes, Device device) {
  return bytes == 0 ? Tensor() : empty({bytes}, DType::u8, device);
}

// The usable plans of the graph, in the heuristics' order: the first one only, or with
// `timed` up to kBenchmarkLimit.
std::vector<Plan> usable_plans(const std::shared_ptr<const Graph>& g, DType dtype, bool timed, cudnnHandle_t h,
                               Tally& tally) {
  const bool tf32 = uses_tf32(dtype), capturing = precis::cuda::any_capture_underway();
  const size_t wanted = timed ? kBenchmarkLimit : 1;
  std::vector<Plan> plans;
  for (cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_B, CUDNN_HEUR_MODE_FALLBACK}) {
    if (mode != CUDNN_HEUR_MODE_A && !timed && !plans.empty()) break;
    for (Desc& config : engine_configs(*g, mode)) {
      ++tally.offered;
      const std::optional<Notes> notes = notes_of(config);
      if (!notes || !numerics_allowed(*notes, dtype, tf32, capturing)) {
        ++tally.numerics;
        continue;
      }
      if (std::optional<Plan> plan = plan_of(std::move(config), g, h, tally)) plans.push_back(std::move(*plan));
      if (plans.size() == wanted) return plans;
    }
  }
  return plans;
}

// For tests (ops/cuda/conv.h): the position among the timed plans that survive to choose
// instead of the fastest (-1: the fastest), under g_mutex.
int g_pick_for_tests = -1;

std::mutex g_mutex;
std::map<GraphKey, std::shared_ptr<const Plan>> g_plans;  // null: the legacy path runs the problem
ConvGraphStats g_stats;                                   // under g_mutex

// out[0] = max |a - b| (infinite where either is NaN), out[1] = max |b|, over n floats, as the
// bits of non-negative floats (which order as unsigned integers); out zeroed by the caller.
__global__ void max_difference_kernel(const float* a, const float* b, int64_t n, unsigned* out) {
  precis::cuda::wait_for_previous_grid();
  precis::cuda::allow_next_grid_to_start();
  float diff = 0, magnitude = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float d = fabsf(a[i] - b[i]);
    diff = d <= diff ? diff : (d == d ? d : INFINITY);
    magnitude = fmaxf(magnitude, fabsf(b[i]));
  }
  for (int offset = 16; offset > 0; offset >>= 1) {
    diff = fmaxf(diff, __shfl_xor_sync(0xffffffffu, diff, offset));
    magnitude = fmaxf(magnitude, __shfl_xor_sync(0xffffffffu, magnitude, offset));
  }
  if ((threadIdx.x & 31) == 0) {
    atomicMax(&out[0], __float_as_uint(diff));
    atomicMax(&out[1], __float_as_uint(magnitude));
  }
}

// Compares a plain-f32 plan's output with the first plan's (the head comment says why).
class F32Agreement {
 public:
  F32Agreement(int64_t n, Device device, cudaStream_t stream)
      : n_(n), stream_(stream), first_(empty({n}, DType::f32, device)), maxima_(empty({2}, DType::i32, device)) {}

  // Whether `out` (n floats on the stream) is the first plan's to f32 rounding; the first call
  // keeps `out` as that reference.
  bool agrees(const void* out) {
    if (!have_first_) {
      PRECIS_CUDA_CHECK(cudaMemcpyAsync(first_.raw_data(), out, n_ * sizeof(float), cudaMemcpyDeviceToDevice, stream_),
                        "conv2d plan check");
      have_first_ = true;
      return true;
    }
    unsigned* maxima = static_cast<unsigned*>(maxima_.raw_data());
    PRECIS_CUDA_CHECK(cudaMemsetAsync(maxima, 0, 2 * sizeof(unsigned), stream_), "conv2d plan check");
    const int blocks = static_cast<int>(std::min<int64_t>((n_ + 255) / 256, 1024));
    precis::cuda::launch(max_difference_kernel, blocks, 256, 0, stream_, static_cast<const float*>(out),
                         static_cast<const float*>(first_.raw_data()), n_, maxima);
    PRECIS_CUDA_CHECK_LAUNCH("conv2d plan check");
    unsigned host[2];
    PRECIS_CUDA_CHECK(cudaMemcpyAsync(host, maxima, sizeof(host), cudaMemcpyDeviceToHost, stream_),
                      "conv2d plan check");
    PRECIS_CUDA_CHECK(cudaStreamSynchronize(stream_), "conv2d plan check");
    float diff, magnitude;
    std::memcpy(&diff, &host[0], sizeof(float));
    std::memcpy(&magnitude, &host[1], sizeof(float));
    return diff <= kF32Agreement * magnitude;
  }

 private:
  int64_t n_;
  cudaStream_t stream_;
  Tensor first_, maxima_;
  bool have_first_ = false;
};

// The fastest of `plans` on the buffers (see the head comment), or the first where none runs.
// `check_floats`, where non-zero, is the output's size of a plain-f32 problem whose plans must
// agree with the first one.
size_t fastest(const std::vector<Plan>& plans, cudnnHandle_t h, const Buffers& io, Device device,
               int64_t check_floats) {
  int64_t bytes = 0;
  for (const Plan& p : plans) bytes = std::max(bytes, p.workspace);
  const Tensor ws = workspace_tensor(bytes, device);
  Tensor scratch;
  const Buffers timing = timing_buffers(io, device, scratch);
  quiesce_for_timing(device);
  const cudaStream_t stream = precis::cuda::compute_stream(device);
  std::optional<F32Agreement> agreement;
  if (check_floats > 0) agreement.emplace(check_floats, device, stream);
  std::vector<size_t> kept;  // the plans that ran (and agree), in order
  size_t best = 0;
  float best_ms = 0;
  for (size_t i = 0; i < plans.size(); ++i) {
    // A sum being added to is timed into scratch: zeroed, every plan adds the same runs into it.
    if (agreement && io.out_bytes_to_keep > 0)
      PRECIS_CUDA_CHECK(cudaMemsetAsync(timing.out, 0, io.out_bytes_to_keep, stream), "conv2d engine timing");
    bool ran = true;
    const float ms = precis::cuda::fastest_run_ms(stream, kTimedRuns, "conv2d engine timing", [&] {
      ran = ran && execute(h, plans[i], timing, ws.defined() ? ws.raw_data() : nullptr) == CUDNN_STATUS_SUCCESS;
    });
    if (!ran) continue;
    if (agreement && !agreement->agrees(timing.out)) {
      ++g_stats.disagreed;
      continue;
    }
    if (kept.empty() || ms < best_ms) {
      best = i;
      best_ms = ms;
    }
    kept.push_back(i);
  }
  if (g_pick_for_tests >= 0 && !kept.empty())
    return kept[std::min<size_t>(static_cast<size_t>(g_pick_for_tests), kept.size() - 1)];
  return best;
}

// The number of values a direction writes: y, dx or dw.
int64_t output_elements(Direction direction, const Conv2dShapes& s) {
  switch (direction) {
    case Direction::forward:
      return s.N * s.Cout * s.OH * s.OW;
    case Direction::backward_data:
      return s.N * s.Cin * s.H * s.W;
    case Direction::backward_filter:
      return s.Cout * (s.Cin / s.options.groups) * s.kH * s.kW;
  }
  return 0;
}

// The cached plan of the problem (chosen on first meeting), or null for the legacy path.
std::shared_ptr<const Plan> choose(Direction direction, const Conv2dShapes& s, MemoryFormat format, DType dtype,
                                   const Buffers& io, Device device, cudnnHandle_t h) {
  const bool benchmark = cudnn_benchmark();
  const GraphKey key{key_of(s, format, dtype, direction, benchmark, device), io.out_bytes_to_keep > 0,
                     alignment_of(io.a), alignment_of(io.b), alignment_of(io.out)};
  std::lock_guard<std::mutex> lock(g_mutex);
  if (auto it = g_plans.find(key); it != g_plans.end()) return it->second;
  std::string rejected;
  std::shared_ptr<const Plan> chosen;
  if (std::shared_ptr<const Graph> g = build_graph(direction, s, format, dtype, key, h, rejected)) {
    const bool timed = may_time(benchmark);
    Tally tally;
    std::vector<Plan> plans = usable_plans(g, dtype, timed, h, tally);
    if (plans.empty()) {
      rejected = tally.describe();
    } else {
      const bool compare = timed && plans.size() > 1;
      const int64_t check_floats = dtype == DType::f32 && !uses_tf32(dtype) ? output_elements(direction, s) : 0;
      chosen =
          std::make_shared<const Plan>(std::move(plans[compare ? fastest(plans, h, io, device, check_floats) : 0]));
      ++g_stats.planned;
      if (compare) ++g_stats.timed;
    }
  }
  if (!chosen) {
    ++g_stats.fell_back;
    std::cerr << "note: " << kConvOp << ": cuDNN's graph API runs no " << describe_problem(direction, s, format, dtype)
              << " (" << rejected << "); the legacy API runs it (said once)\n";
  }
  g_plans.emplace(key, chosen);
  return chosen;
}

}  // namespace

bool conv2d_graph(Direction direction, const Conv2dShapes& s, MemoryFormat format, DType dtype, const Buffers& io,
                  Device device) {
  cudnnHandle_t h = cudnn::handle(device);
  const std::shared_ptr<const Plan> plan = choose(direction, s, format, dtype, io, device, h);
  if (!plan) return false;
  // In a capture, a workspace slice of its own (core/cuda/graph_memsets.h).
  const precis::cuda::CaptureWorkspace slice(device, precis::cuda::compute_stream(device),
                                             static_cast<size_t>(plan->workspace));
  const Tensor ws = slice.data() ? Tensor() : workspace_tensor(plan->workspace, device);
  PRECIS_CUDNN_CHECK(execute(h, *plan, io,
                             slice.data()   ? slice.data()
                             : ws.defined() ? ws.raw_data()
                                            : nullptr),
                     kConvOp, ": running the ", describe_problem(direction, s, format, dtype), " on cuDNN's graph API");
  std::lock_guard<std::mutex> lock(g_mutex);
  ++g_stats.runs;
  return true;
}

ConvGraphStats conv_graph_stats() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_stats;
}

void set_conv_graph_pick_for_tests(int position) {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_pick_for_tests = position;
  g_plans.clear();
}

}  // namespace precis::ops::cuda
