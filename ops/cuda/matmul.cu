// Matrix products on the GPU through cuBLASLt, and the two small kernels that
// go with linear_gelu: the GELU gradient, and bias + GELU for a product whose
// epilogue could not be fused.
//
// Row-major through a column-major library. cuBLASLt reads matrices
// column-major, and a row-major [R, C] matrix read column-major is its
// transpose [C, R]. So for the row-major D = A B (A: [M, K], B: [K, N]) we ask
// cuBLASLt for D^T = B^T A^T: its m = N, n = M, k = K, its first operand is our
// B, its second our A, and the column-major D^T it writes is D, row-major. A
// transposed view (columns dense) read column-major is the matrix itself, so it
// goes in with CUBLAS_OP_T instead of being copied.
//
// Epilogues in those terms. For linear, z = x W^T + b (m = out features, n = rows of x):
//   BIAS, GELU_BIAS    add b (one value per row of D^T, i.e. per output feature), then GELU;
//   GELU_AUX(_BIAS)    also store z in the aux matrix (leading dim a multiple of 8).
// For linear's weight gradient dW = g^T x (m = in, n = out, k = rows of g):
//   BGRADB             sum the second operand, g^T read in place from g, over k:
//                      db = g summed over its rows, in the same pass over g.
// For the input gradient of a linear applied to a GELU's output, dz = (g W) * gelu'(z)
// (m = in, n = rows of g, k = out), with z the aux matrix the forward's GELU_AUX stored:
//   DGELU              multiply the product by gelu'(aux) as it is written;
//   DGELU_BGRAD        and sum dz over its rows (one value per row of D^T): the bias
//                      gradient of the linear that produced z, with no pass of its own.
//
// Choosing the algorithm. cuBLASLt's heuristic ranks algorithms by a model of the
// GPU, and its first choice is not always the fastest: on an H100 it gave GPT-2's
// f16 products (the same shapes as bf16) older xmma kernels that ran the f16 step
// ~1.3 ms slower than bf16's. So, with ops::matmul_autotune() on, a problem large
// enough to matter is timed once: its first kAutotuneCandidates heuristic answers
// each run kAutotuneRuns times on the real operands (a product with beta = 0 writes
// only D and the epilogue's outputs, so a run repeats nothing; the real run follows;
// one that adds into D, beta = 1, is timed on a scratch D) and the fastest, by more
// than kAutotuneMargin, is cached. Never during a
// CUDA graph capture (timing synchronises): there the heuristic's first answer is used.
// The same timing decides between a fused epilogue and the plain product plus a
// separate pass (prefer_fused: linear's bias gradient, BGRADB or DGELU_BGRAD against
// column_sums).
//
// Weight gradients in f32. linear_param_backward may write dW (and db) in f32 from
// f16/bf16 operands (D and C of type f32, CUBLAS_COMPUTE_32F: the accumulator is stored
// unrounded), and may add into them (beta = 1): a product writes a parameter's gradient
// straight into the flat f32 gradient buffer (core/autograd.h, take_grad_destination).
// A bias gradient from an epilogue has D's type and cannot be added to: where db must be
// added, or differs in type from D, column_sums makes it (it writes f32 and adds).
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <atomic>
#include <compare>
#include <cstdint>
#include <iostream>
#include <limits>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <tuple>
#include <utility>

#include "core/allocator.h"
#include "core/copy.h"
#include "core/cuda/launch.cuh"
#include "core/cuda/runtime.h"
#include "ops/cuda/column_sums.h"
#include "ops/cuda/cublas_check.h"
#include "ops/cuda/matmul.h"
#include "ops/matmul.h"

namespace precis::ops::cuda {

namespace {

constexpr size_t kWorkspaceBytes = size_t(32) << 20;
std::atomic<bool> g_fuse_epilogues{true};

constexpr int kAutotuneCandidates = 8;
constexpr int kAutotuneRuns = 3;  // after one untimed run; the fastest of the runs counts
constexpr double kAutotuneMargin = 0.02;
constexpr double kAutotuneMinFlops = 2.0 * 256 * 256 * 256;  // smaller products are launch-bound

// ---------------------------------------------------------------------------
// Kernels. GELU is the tanh approximation, computed in f32:
//   gelu(z)  = 0.5 z (1 + tanh(u)),  u = k (z + c z^3),  k = sqrt(2/pi), c = 0.044715
//   gelu'(z) = 0.5 (1 + t) + 0.5 z (1 - t^2) k (1 + 3 c z^2),  t = tanh(u)

constexpr float kGeluK = 0.7978845608028654f;
constexpr float kGeluC = 0.044715f;

__device__ __forceinline__ float gelu_tanh(float z) {
  return 0.5f * z * (1.0f + tanhf(kGeluK * (z + kGeluC * z * z * z)));
}

__device__ __forceinline__ float gelu_tanh_grad(float z) {
  float t = tanhf(kGeluK * (z + kGeluC * z * z * z));
  return 0.5f * (1.0f + t) + 0.5f * z * (1.0f - t * t) * kGeluK * (1.0f + 3.0f * kGeluC * z * z);
}

// out[r, c] = act(out[r, c] + bias[c]) over a dense [rows, cols] out, act = GELU
// or identity; pre[r, c] (row stride pre_ld) keeps the activation's input.
// bias and pre may be null.
template <typename T>
__global__ void bias_gelu_kernel(T* out, const T* bias, T* pre, int64_t pre_ld, int64_t rows, int64_t cols, bool gelu) {
  precis::cuda::wait_for_previous_grid();
  precis::cuda::allow_next_grid_to_start();
  int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= rows * cols) return;
  int64_t r = i / cols, c = i % cols;
  float z = static_cast<float>(out[i]);
  if (bias) z += static_cast<float>(bias[c]);
  if (pre) pre[r * pre_ld + c] = static_cast<T>(z);
  out[i] = static_cast<T>(gelu ? gelu_tanh(z) : z);
}

// grad_pre[r, c] = grad_out[r, c] * gelu'(pre[r, c]); grad_out, grad_pre dense, pre with row stride pre_ld.
template <typename T>
__global__ void gelu_backward_kernel(T* grad_pre, const T* grad_out, const T* pre, int64_t pre_ld, int64_t rows,
                                     int64_t cols) {
  precis::cuda::wait_for_previous_grid();
  precis::cuda::allow_next_grid_to_start();
  int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= rows * cols) return;
  int64_t r = i / cols, c = i % cols;
  grad_pre[i] =
      static_cast<T>(static_cast<float>(grad_out[i]) * gelu_tanh_grad(static_cast<float>(pre[r * pre_ld + c])));
}

template <typename T>
struct TypeTag {
  using type = T;
};

// Calls fn(TypeTag<T>) with the device type of a cuBLASLt dtype.
template <typename Fn>
void dispatch_gpu_float(DType dtype, const char* op, Fn fn) {
  switch (dtype) {
    case DType::f32:
      return fn(TypeTag<float>{});
    case DType::f16:
      return fn(TypeTag<__half>{});
    case DType::bf16:
      return fn(TypeTag<__nv_bfloat16>{});
    default:
      PRECIS_FAIL(op, ": no GPU kernel for ", dtype_name(dtype));
  }
}

// ---------------------------------------------------------------------------
// Per-device cuBLASLt state, made on first use (never at program start: a
// machine without a driver must not touch CUDA). Every product of a device runs
// on its compute stream, in order, so one workspace per device suffices.

struct DeviceState {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;  // kWorkspaceBytes from the device's allocator
};

DeviceState& device_state(Device device) {
  static std::mutex mutex;
  static std::map<int, DeviceState> states;  // kept until the process ends
  std::lock_guard<std::mutex> lock(mutex);
  DeviceState& state = states[device.index];
  if (!state.handle) {
    precis::cuda::set_device(device);
    if (!state.workspace) state.workspace = allocator_for(device).allocate(kWorkspaceBytes);
    PRECIS_CUBLAS_CHECK(cublasLtCreate(&state.handle), "matmul: creating the cuBLASLt handle of ", device);
  }
  return state;
}

// Owns a cuBLASLt descriptor, so an error thrown half-way leaks none.
template <typename Handle, cublasStatus_t (*Destroy)(Handle)>
class Owned {
 public:
  Owned() = default;
  ~Owned() {
    if (handle_) Destroy(handle_);
  }
  Owned(const Owned&) = delete;
  Owned& operator=(const Owned&) = delete;
  Handle* out() { return &handle_; }
  Handle get() const { return handle_; }

 private:
  Handle handle_ = nullptr;
};
using MatmulDesc = Owned<cublasLtMatmulDesc_t, cublasLtMatmulDescDestroy>;
using MatrixLayout = Owned<cublasLtMatrixLayout_t, cublasLtMatrixLayoutDestroy>;
using Preference = Owned<cublasLtMatmulPreference_t, cublasLtMatmulPreferenceDestroy>;

cudaDataType_t cuda_type(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return CUDA_R_32F;
    case DType::f16:
      return CUDA_R_16F;
    default:
      return CUDA_R_16BF;
  }
}

const char* epilogue_name(cublasLtEpilogue_t epilogue) {
  switch (epilogue) {
    case CUBLASLT_EPILOGUE_DEFAULT:
      return "DEFAULT";
    case CUBLASLT_EPILOGUE_BIAS:
      return "BIAS";
    case CUBLASLT_EPILOGUE_GELU:
      return "GELU";
    case CUBLASLT_EPILOGUE_GELU_BIAS:
      return "GELU_BIAS";
    case CUBLASLT_EPILOGUE_GELU_AUX:
      return "GELU_AUX";
    case CUBLASLT_EPILOGUE_GELU_AUX_BIAS:
      return "GELU_AUX_BIAS";
    case CUBLASLT_EPILOGUE_BGRADB:
      return "BGRADB";
    case CUBLASLT_EPILOGUE_DGELU:
      return "DGELU";
    case CUBLASLT_EPILOGUE_DGELU_BGRAD:
      return "DGELU_BGRAD";
    default:
      return "other";
  }
}

// The largest power of two, up to 256, dividing the address and every stride
// in bytes: the alignment the heuristic may count on for that operand.
uint32_t alignment(const void* data, size_t element_bytes, std::initializer_list<int64_t> strides) {
  uint64_t bits = reinterpret_cast<uintptr_t>(data) | 256u;
  for (int64_t s : strides) bits |= static_cast<uint64_t>(s) * element_bytes;
  return static_cast<uint32_t>(bits & (~bits + 1));
}

// ---------------------------------------------------------------------------
// One cuBLASLt product in its own column-major terms: D (m x n) = op(A) (m x k)
// op(B) (k x n), `batch` times with each operand `stride` elements after the
// previous, then the epilogue. C is D: beta = 0, or 1 to add the product into D.
struct Gemm {
  const char* op = "matmul";
  Device device;
  DType dtype = DType::f32;      // of A and B
  DType out_dtype = DType::f32;  // of D (C) and of a bias or bias gradient: dtype, or f32
  bool accumulate = false;       // D += product (beta = 1)
  int64_t m = 0, n = 0, k = 0, batch = 1;
  const void* a = nullptr;
  bool trans_a = false;
  int64_t lda = 0, stride_a = 0;
  const void* b = nullptr;
  bool trans_b = false;
  int64_t ldb = 0, stride_b = 0;
  void* d = nullptr;
  int64_t ldd = 0, stride_d = 0;
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  void* bias = nullptr;  // read by the BIAS epilogues, written by BGRADB
  void* aux = nullptr;   // the GELU input, written by GELU_AUX, read by DGELU
  int64_t aux_ld = 0;

  // The problem in the user's row-major terms, for error messages.
  std::string problem() const {
    return detail::concat(dtype_name(dtype), " [", n, ", ", k, "] x [", k, ", ", m, "]",
                          batch > 1 ? detail::concat(" (batch of ", batch, ")") : std::string(),
                          out_dtype != dtype ? detail::concat(" into ", dtype_name(out_dtype)) : std::string(),
                          accumulate ? " (added to D)" : "", " with the ", epilogue_name(epilogue), " epilogue on ",
                          device);
  }
};

// Everything the heuristic's answer depends on.
struct AlgoKey {
  int device, dtype, out_dtype, compute, epilogue;
  bool accumulate;
  int64_t m, n, k, batch;
  bool trans_a, trans_b;
  int64_t lda, ldb, ldd, stride_a, stride_b, stride_d, aux_ld;
  uint32_t align_a, align_b, align_d, align_bias, align_aux;
  auto operator<=>(const AlgoKey&) const = default;
};

struct CachedAlgo {
  bool found = false;
  cublasLtMatmulAlgo_t algo{};
};

// The descriptors of one product, as cublasLtMatmul takes them.
struct Problem {
  cublasLtHandle_t handle;
  cublasLtMatmulDesc_t desc;
  cublasLtMatrixLayout_t a, b, d;
  void* workspace;
  cudaStream_t stream;
};

void run_algo(const Gemm& g, const Problem& p, const cublasLtMatmulAlgo_t& algo) {
  const float alpha = 1.0f, beta = g.accumulate ? 1.0f : 0.0f;
  PRECIS_CUBLAS_CHECK(cublasLtMatmul(p.handle, p.desc, &alpha, g.a, p.a, g.b, p.b, &beta, g.d, p.d, g.d, p.d, &algo,
                                     p.workspace, kWorkspaceBytes, p.stream),
                      g.op, " ", g.problem());
}

// The fastest of kAutotuneRuns timed runs of `work` on `stream`, in milliseconds, after one
// untimed run (the algorithm choice of any product inside it, and warm-up).
template <typename Work>
float fastest_run_ms(cudaStream_t stream, Work&& work) {
  const char* op = "matmul autotune";
  cudaEvent_t start = nullptr, stop = nullptr;
  PRECIS_CUDA_CHECK(cudaEventCreate(&start), op);
  PRECIS_CUDA_CHECK(cudaEventCreate(&stop), op);
  work();
  float best = std::numeric_limits<float>::infinity();
  for (int r = 0; r < kAutotuneRuns; ++r) {
    PRECIS_CUDA_CHECK(cudaEventRecord(start, stream), op);
    work();
    PRECIS_CUDA_CHECK(cudaEventRecord(stop, stream), op);
    PRECIS_CUDA_CHECK(cudaEventSynchronize(stop), op);
    float ms = 0;
    PRECIS_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop), op);
    best = std::min(best, ms);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return best;
}

// The fastest of `candidates` (in the heuristic's order; a later one must win by the margin).
// A product that adds into D runs on a scratch D: every run would add to the real one.
cublasLtMatmulAlgo_t fastest(const Gemm& g, const Problem& p, const cublasLtMatmulHeuristicResult_t* candidates,
                             int count) {
  Gemm timed = g;
  Tensor scratch;
  if (g.accumulate) {
    scratch = zeros({(g.batch - 1) * g.stride_d + g.ldd * g.n}, g.out_dtype, g.device);
    timed.d = scratch.raw_data();
  }
  int best = 0;
  float best_ms = 0;
  for (int c = 0; c < count; ++c) {
    const float ms = fastest_run_ms(p.stream, [&] { run_algo(timed, p, candidates[c].algo); });
    if (c == 0 || ms < best_ms * (1.0 - kAutotuneMargin)) {
      best = c;
      best_ms = ms;
    }
  }
  return candidates[best].algo;
}

std::mutex g_cache_mutex;
std::map<AlgoKey, CachedAlgo> g_cache;
MatmulCacheStats g_stats;

void set_layout(MatrixLayout& layout, const Gemm& g, cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld,
                int64_t stride) {
  PRECIS_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(layout.out(), type, rows, cols, ld), g.op, " ", g.problem());
  if (g.batch == 1) return;
  int32_t count = static_cast<int32_t>(g.batch);
  PRECIS_CUBLAS_CHECK(
      cublasLtMatrixLayoutSetAttribute(layout.get(), CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)), g.op,
      " ", g.problem());
  PRECIS_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(layout.get(), CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                       &stride, sizeof(stride)),
                      g.op, " ", g.problem());
}

// Runs the product on the compute stream. Returns false, having run nothing,
// when cuBLASLt has no algorithm for it (the caller may then drop the epilogue).
bool try_run(const Gemm& g) {
  DeviceState& state = device_state(g.device);
  precis::cuda::set_device(g.device);
  const cudaDataType_t type = cuda_type(g.dtype), out_type = cuda_type(g.out_dtype);
  PRECIS_CHECK(g.out_dtype == g.dtype || g.out_dtype == DType::f32, g.op,
               ": a product writes its operands' dtype or f32, not ", g.problem());
  const cublasComputeType_t compute =
      g.dtype == DType::f32 && allow_tf32() ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;

  MatmulDesc desc;
  PRECIS_CUBLAS_CHECK(cublasLtMatmulDescCreate(desc.out(), compute, CUDA_R_32F), g.op, " ", g.problem());
  const cublasOperation_t op_a = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, op_b = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  PRECIS_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc.get(), CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)),
                      g.op, " ", g.problem());
  PRECIS_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc.get(), CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)),
                      g.op, " ", g.problem());
  PRECIS_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(desc.get(), CUBLASLT_MATMUL_DESC_EPILOGUE, &g.epilogue, sizeof(g.epilogue)), g.op,
      " ", g.problem());
  if (g.bias) {
    PRECIS_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(desc.get(), CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g.bias, sizeof(g.bias)), g.op,
        " ", g.problem());
  }
  if (g.aux) {
    PRECIS_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(desc.get(), CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &g.aux, sizeof(g.aux)),
        g.op, " ", g.problem());
    PRECIS_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(desc.get(), CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &g.aux_ld, sizeof(g.aux_ld)),
        g.op, " ", g.problem());
  }
  MatrixLayout layout_a, layout_b, layout_d;
  set_layout(layout_a, g, type, g.trans_a ? g.k : g.m, g.trans_a ? g.m : g.k, g.lda, g.stride_a);
  set_layout(layout_b, g, type, g.trans_b ? g.n : g.k, g.trans_b ? g.k : g.n, g.ldb, g.stride_b);
  set_layout(layout_d, g, out_type, g.m, g.n, g.ldd, g.stride_d);

  const size_t bytes = element_size(g.dtype), out_bytes = element_size(g.out_dtype);
  const AlgoKey key{g.device.index,
                    static_cast<int>(g.dtype),
                    static_cast<int>(g.out_dtype),
                    static_cast<int>(compute),
                    static_cast<int>(g.epilogue),
                    g.accumulate,
                    g.m,
                    g.n,
                    g.k,
                    g.batch,
                    g.trans_a,
                    g.trans_b,
                    g.lda,
                    g.ldb,
                    g.ldd,
                    g.stride_a,
                    g.stride_b,
                    g.stride_d,
                    g.aux_ld,
                    alignment(g.a, bytes, {g.lda, g.stride_a}),
                    alignment(g.b, bytes, {g.ldb, g.stride_b}),
                    alignment(g.d, out_bytes, {g.ldd, g.stride_d}),
                    g.bias ? alignment(g.bias, out_bytes, {}) : 0u,
                    g.aux ? alignment(g.aux, bytes, {g.aux_ld}) : 0u};
  const Problem problem{state.handle,
                        desc.get(),
                        layout_a.get(),
                        layout_b.get(),
                        layout_d.get(),
                        state.workspace,
                        precis::cuda::compute_stream(g.device)};
  CachedAlgo cached;
  {
    std::lock_guard<std::mutex> lock(g_cache_mutex);
    ++g_stats.lookups;
    auto it = g_cache.find(key);
    if (it != g_cache.end()) {
      ++g_stats.hits;
      cached = it->second;
    } else {
      Preference preference;
      PRECIS_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(preference.out()), g.op, " ", g.problem());
      const uint64_t workspace = kWorkspaceBytes;
      PRECIS_CUBLAS_CHECK(
          cublasLtMatmulPreferenceSetAttribute(preference.get(), CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace,
                                               sizeof(workspace)),
          g.op, " ", g.problem());
      const std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t> alignments[] = {
          {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, key.align_a},
          {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, key.align_b},
          {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, key.align_d},
          {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, key.align_d}};
      for (const auto& [attribute, bytes_aligned] : alignments) {
        PRECIS_CUBLAS_CHECK(
            cublasLtMatmulPreferenceSetAttribute(preference.get(), attribute, &bytes_aligned, sizeof(bytes_aligned)),
            g.op, " ", g.problem());
      }
      const double flops = 2.0 * static_cast<double>(g.m) * static_cast<double>(g.n) * static_cast<double>(g.k) *
                           static_cast<double>(g.batch);
      const bool tune = matmul_autotune() && flops >= kAutotuneMinFlops && !precis::cuda::is_capturing(problem.stream);
      cublasLtMatmulHeuristicResult_t results[kAutotuneCandidates] = {};
      int found = 0;
      cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(state.handle, desc.get(), layout_a.get(), layout_b.get(),
                                                             layout_d.get(), layout_d.get(), preference.get(),
                                                             tune ? kAutotuneCandidates : 1, results, &found);
      // NOT_SUPPORTED is how the heuristic says that nothing fits this configuration.
      if (status != CUBLAS_STATUS_NOT_SUPPORTED) {
        PRECIS_CUBLAS_CHECK(status, g.op, " ", g.problem());
      }
      cached.found = status == CUBLAS_STATUS_SUCCESS && found > 0;
      if (cached.found) {
        cached.algo = found > 1 ? fastest(g, problem, results, found) : results[0].algo;
        if (found > 1) ++g_stats.autotuned;
      }
      g_cache.emplace(key, cached);
    }
  }
  if (!cached.found) return false;
  run_algo(g, problem, cached.algo);
  return true;
}

void run(const Gemm& g) { PRECIS_CHECK(try_run(g), g.op, ": cuBLASLt has no algorithm for ", g.problem()); }

// Whether a product with a fused epilogue should run as such, or as `split` (the plain
// product and a separate pass: for BGRADB, our column-sum kernel over g, column_sums.cu).
// Autotuning times both once per problem, as it times algorithms: cuBLASLt's fastest fused
// candidate is not always faster than its plain product plus one more pass (on an H100,
// GPT-2's f16 weight gradients with BGRADB got xmma kernels ~0.6 ms/step slower than the
// plain product's nvjet kernels and a bias sum, measured when that sum was still
// cuBLASLt's g^T 1 product). Without autotuning, for small problems, or in a capture that
// finds no choice made by the eager steps before it: fused.
// Neither may add into its outputs (each runs several times).
template <typename Split>
bool prefer_fused(const Gemm& fused, Split&& split) {
  static std::mutex mutex;
  static std::map<std::tuple<int, int, int, int, int64_t, int64_t, int64_t>, bool> choices;
  PRECIS_CHECK(!fused.accumulate, fused.op, ": cannot time ", fused.problem(), " on its real output");
  const double flops = 2.0 * static_cast<double>(fused.m) * static_cast<double>(fused.n) *
                       static_cast<double>(fused.k) * static_cast<double>(fused.batch);
  if (!matmul_autotune() || flops < kAutotuneMinFlops) return true;
  const auto key = std::make_tuple(fused.device.index, static_cast<int>(fused.dtype), static_cast<int>(fused.out_dtype),
                                   static_cast<int>(fused.epilogue), fused.m, fused.n, fused.k);
  std::lock_guard<std::mutex> lock(mutex);
  // A capture replays what the eager warm-up steps chose; it cannot time anything itself.
  if (auto it = choices.find(key); it != choices.end()) return it->second;
  cudaStream_t stream = precis::cuda::compute_stream(fused.device);
  if (precis::cuda::is_capturing(stream)) return true;
  bool fused_ran = true;
  const float fused_ms = fastest_run_ms(stream, [&] { fused_ran = fused_ran && try_run(fused); });
  const float split_ms = fastest_run_ms(stream, split);
  // Fused unless it was measurably slower (or never ran: the caller then tries it and says why not).
  const bool choice = !fused_ran || fused_ms <= split_ms * (1.0 + kAutotuneMargin);
  choices.emplace(key, choice);
  return choice;
}

// An epilogue cuBLASLt cannot fuse is applied by a separate kernel; say so once per epilogue.
void note_unfused(const Gemm& g) {
  static std::mutex mutex;
  static std::set<int> noted;
  std::lock_guard<std::mutex> lock(mutex);
  if (!noted.insert(static_cast<int>(g.epilogue)).second) return;
  std::cerr << "note: " << g.op << ": cuBLASLt has no algorithm for " << g.problem()
            << "; a separate kernel does the epilogue's work (said once)\n";
}

// ---------------------------------------------------------------------------
// Operands as matrices.

// All defined tensors on one CUDA device in one dtype, f32, f16 or bf16; returns that dtype.
DType check_operands(const char* op, std::initializer_list<const Tensor*> tensors) {
  const Tensor* first = nullptr;
  for (const Tensor* t : tensors) {
    if (!t->defined()) continue;
    if (!first) first = t;
    PRECIS_CHECK(t->is_cuda(), op, ": expected CUDA tensors, got ", describe(*t));
    PRECIS_CHECK(t->device() == first->device() && t->dtype() == first->dtype(), op,
                 ": operands must share one device and one dtype, got ", describe(*first), " and ", describe(*t));
  }
  PRECIS_CHECK(first, op, ": every operand is undefined");
  DType dtype = first->dtype();
  PRECIS_CHECK(dtype == DType::f32 || dtype == DType::f16 || dtype == DType::bf16, op,
               ": GPU products take float32, float16 or bfloat16, got ", describe(*first));
  return dtype;
}

// How the last two dims of a tensor lie in memory: rows dense (row-major),
// columns dense (column-major, as in a transposed view), or neither.
enum class Layout { row_major, col_major, neither };
Layout layout_of(const Tensor& t) {
  int64_t rows = t.shape()[t.dim() - 2], cols = t.shape()[t.dim() - 1];
  int64_t rs = t.strides()[t.dim() - 2], cs = t.strides()[t.dim() - 1];
  if ((cs == 1 || cols == 1) && (rs >= cols || rows == 1)) return Layout::row_major;
  if ((rs == 1 || rows == 1) && (cs >= rows || cols == 1)) return Layout::col_major;
  return Layout::neither;
}

// `t` itself when cuBLASLt can read its last two dims in place, else a dense copy. No autograd.
Tensor readable(const Tensor& t) { return layout_of(t) == Layout::neither ? t.detach().contiguous() : t; }

// The transpose of a 2-D tensor, as a view without autograd.
Tensor transposed(const Tensor& t) {
  return t.as_strided({t.shape()[1], t.shape()[0]}, {t.strides()[1], t.strides()[0]}, t.offset());
}

// The last two dims of a readable tensor: element (i, j) of its first matrix is at
// data + (i ld + j) elements (row-major) or data + (i + j ld) (column-major).
struct Matrix {
  const char* data;
  bool col_major;
  int64_t ld;
};
Matrix matrix_of(const Tensor& t) {
  int64_t rows = t.shape()[t.dim() - 2], cols = t.shape()[t.dim() - 1];
  if (layout_of(t) == Layout::row_major)
    return {static_cast<const char*>(t.raw_data()), false, std::max(t.strides()[t.dim() - 2], cols)};
  return {static_cast<const char*>(t.raw_data()), true, std::max(t.strides()[t.dim() - 1], rows)};
}

// The cuBLASLt problem for the row-major D = A B with A: [M, K], B: [K, N] and D
// dense [M, N] at `d` (see the top of the file).
Gemm row_major_product(const char* op, Device device, DType dtype, const Matrix& a, const Matrix& b, void* d, int64_t M,
                       int64_t N, int64_t K) {
  Gemm g;
  g.op = op;
  g.device = device;
  g.dtype = dtype;
  g.out_dtype = dtype;
  g.m = N;
  g.n = M;
  g.k = K;
  g.a = b.data;
  g.trans_a = b.col_major;
  g.lda = b.ld;
  g.b = a.data;
  g.trans_b = a.col_major;
  g.ldb = a.ld;
  g.d = d;
  g.ldd = N;
  return g;
}

// The stride of `t` along dim `d` of an `out_batch`-dim batch shape (aligned
// from the right): 0 where t lacks the dim or broadcasts it.
int64_t batch_stride(const char* op, const Tensor& t, const Shape& out_batch, size_t d) {
  int64_t t_batch = t.dim() - 2;
  int64_t j = static_cast<int64_t>(d) - (static_cast<int64_t>(out_batch.size()) - t_batch);
  if (j < 0 || t.shape()[j] == 1) return 0;
  PRECIS_CHECK(t.shape()[j] == out_batch[d], op, ": batch dims of ", describe(t), " do not broadcast to ", out_batch);
  return t.strides()[j];
}

// A weight gradient's product. Where cuBLASLt has no algorithm writing f32 from f16/bf16
// operands (said once), it runs in the operands' dtype into a scratch matrix, then
// widened into `out` or added to it.
void run_weight_gradient(const Gemm& g, const Tensor& out) {
  if (try_run(g)) return;
  PRECIS_CHECK(g.out_dtype != g.dtype, g.op, ": cuBLASLt has no algorithm for ", g.problem());
  static std::once_flag noted;
  std::call_once(noted, [&] {
    std::cerr << "note: " << g.op << ": cuBLASLt has no algorithm for " << g.problem() << "; the gradient is made in "
              << dtype_name(g.dtype) << " and then widened (said once)\n";
  });
  Tensor scratch = empty(out.shape(), g.dtype, out.device());
  Gemm narrow = g;
  narrow.out_dtype = g.dtype;
  narrow.accumulate = false;
  narrow.d = scratch.raw_data();
  run(narrow);
  if (g.accumulate)
    accumulate_(out, scratch);
  else
    copy_(out, scratch);
}

// A parameter gradient written by a product of `dtype` operands: contiguous `shape`, in `dtype` or f32,
// on `device` (check_operands checked the operands).
void check_gradient_output(const char* op, const char* what, const Tensor& t, DType dtype, Device device,
                           const Shape& shape) {
  PRECIS_CHECK(t.is_cuda() && t.device() == device && (t.dtype() == dtype || t.dtype() == DType::f32) &&
                   t.shape() == shape && t.is_contiguous(),
               op, ": ", what, " ", describe(t), " must be contiguous ", shape, " on ", device, ", of ",
               dtype_name(dtype), " or float32");
}

}  // namespace

// ---------------------------------------------------------------------------

void matmul(const Tensor& out, const Tensor& a_in, const Tensor& b_in) {
  const char* op = "matmul";
  DType dtype = check_operands(op, {&out, &a_in, &b_in});
  PRECIS_CHECK(a_in.dim() >= 2 && b_in.dim() >= 2 && out.dim() >= 2, op, ": operands must have at least 2 dims, got ",
               describe(a_in), ", ", describe(b_in), " and out ", describe(out));
  const int64_t M = a_in.shape()[a_in.dim() - 2], K = a_in.shape().back(), N = b_in.shape().back();
  Shape batch(out.shape().begin(), out.shape().end() - 2);
  PRECIS_CHECK(b_in.shape()[b_in.dim() - 2] == K && out.shape()[out.dim() - 2] == M && out.shape().back() == N &&
                   out.is_contiguous() && a_in.dim() - 2 <= out.dim() - 2 && b_in.dim() - 2 <= out.dim() - 2,
               op, ": shapes ", a_in.shape(), " x ", b_in.shape(), " do not fit a contiguous out ", describe(out));
  if (out.numel() == 0) return;
  if (K == 0) {
    fill_(out, 0.0);
    return;
  }
  const Tensor a = readable(a_in), b = readable(b_in);
  const Matrix ma = matrix_of(a), mb = matrix_of(b);

  // Batch dims of size > 1, with the strides of a, b and out along each (0 where broadcast).
  std::vector<int64_t> sizes, sa, sb, so;
  for (size_t d = 0; d < batch.size(); ++d) {
    int64_t stride_a = batch_stride(op, a, batch, d), stride_b = batch_stride(op, b, batch, d);
    if (batch[d] == 1) continue;
    sizes.push_back(batch[d]);
    sa.push_back(stride_a);
    sb.push_back(stride_b);
    so.push_back(out.strides()[d]);
  }
  // The trailing dims whose strides line up in all three tensors make one strided
  // batch; the leading ones (a broadcast that no single stride describes) are looped over.
  size_t first = sizes.empty() ? 0 : sizes.size() - 1;
  auto lines_up = [&](size_t d) {
    return sa[d] == sa[d + 1] * sizes[d + 1] && sb[d] == sb[d + 1] * sizes[d + 1] && so[d] == so[d + 1] * sizes[d + 1];
  };
  while (first > 0 && lines_up(first - 1)) --first;
  int64_t count = 1, stride_a = 0, stride_b = 0;
  for (size_t d = first; d < sizes.size(); ++d) count *= sizes[d];
  if (count > 1) {
    stride_a = sa.back();
    stride_b = sb.back();
  }
  PRECIS_CHECK(count <= INT32_MAX, op, ": a batch of ", count, " products is more than cuBLASLt takes");
  // A batch that shares one b, with a's rows evenly spaced across it, is one
  // taller product: [count*M, K] x [K, N].
  int64_t rows = M;
  if (count > 1 && stride_b == 0 && !ma.col_major && stride_a == M * ma.ld) {
    rows = M * count;
    count = 1;
    stride_a = 0;
  }

  int64_t outer = 1;
  for (size_t d = 0; d < first; ++d) outer *= sizes[d];
  const size_t bytes = element_size(dtype);
  for (int64_t index = 0; index < outer; ++index) {
    int64_t offset_a = 0, offset_b = 0, offset_out = 0;
    for (int64_t d = static_cast<int64_t>(first) - 1, rest = index; d >= 0; --d) {
      int64_t i = rest % sizes[d];
      rest /= sizes[d];
      offset_a += i * sa[d];
      offset_b += i * sb[d];
      offset_out += i * so[d];
    }
    Gemm g = row_major_product(op, out.device(), dtype, {ma.data + offset_a * bytes, ma.col_major, ma.ld},
                               {mb.data + offset_b * bytes, mb.col_major, mb.ld},
                               static_cast<char*>(out.raw_data()) + offset_out * bytes, rows, N, K);
    if (count > 1) {
      g.batch = count;
      g.stride_a = stride_b;  // cuBLASLt's first operand is our b
      g.stride_b = stride_a;
      g.stride_d = M * N;
    }
    run(g);
  }
}

int64_t gelu_aux_ld(int64_t out_features) { return (out_features + 7) / 8 * 8; }

void linear(const Tensor& out, const Tensor& x_in, const Tensor& weight_in, const Tensor& bias_in, bool gelu,
            const Tensor& pre) {
  const char* op = gelu ? "linear_gelu" : "linear";
  DType dtype = check_operands(op, {&out, &x_in, &weight_in, &bias_in, &pre});
  PRECIS_CHECK(x_in.dim() == 2 && weight_in.dim() == 2 && x_in.shape()[1] == weight_in.shape()[1], op, ": input ",
               describe(x_in), " and weight ", describe(weight_in), " must be [N, in] and [out, in]");
  const int64_t N = x_in.shape()[0], in = x_in.shape()[1], out_features = weight_in.shape()[0];
  PRECIS_CHECK(out.shape() == Shape({N, out_features}) && out.is_contiguous(), op, ": out ", describe(out),
               " must be contiguous [", N, ", ", out_features, "]");
  PRECIS_CHECK(!bias_in.defined() || bias_in.shape() == Shape({out_features}), op, ": bias ", describe(bias_in),
               " must be [", out_features, "]");
  PRECIS_CHECK(!pre.defined() || gelu, op, ": pre_gelu is only written with gelu");
  PRECIS_CHECK(
      !pre.defined() || (pre.shape() == Shape({N, out_features}) && (pre.strides()[1] == 1 || out_features == 1) &&
                         pre.strides()[0] >= out_features && pre.strides()[0] % 8 == 0),
      op, ": pre_gelu ", describe(pre), " must be [", N, ", ", out_features,
      "] with unit column stride and a row stride that is a multiple of 8, e.g. gelu_aux_ld(", out_features,
      ") = ", gelu_aux_ld(out_features));
  if (out.numel() == 0) return;
  const Tensor bias = bias_in.defined() ? bias_in.detach().contiguous() : Tensor();
  const Device device = out.device();

  if (in > 0) {
    const Tensor x = readable(x_in), weight_t = readable(transposed(weight_in));
    Gemm g =
        row_major_product(op, device, dtype, matrix_of(x), matrix_of(weight_t), out.raw_data(), N, out_features, in);
    if (fuse_epilogues() && (bias.defined() || gelu)) {
      if (gelu && pre.defined()) {
        g.epilogue = bias.defined() ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
        g.aux = pre.raw_data();
        g.aux_ld = pre.strides()[0];
      } else if (gelu) {
        g.epilogue = bias.defined() ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_GELU;
      } else {
        g.epilogue = CUBLASLT_EPILOGUE_BIAS;
      }
      g.bias = bias.defined() ? bias.raw_data() : nullptr;
      if (try_run(g)) return;
      note_unfused(g);
      g.epilogue = CUBLASLT_EPILOGUE_DEFAULT;
      g.bias = g.aux = nullptr;
      g.aux_ld = 0;
    }
    run(g);
  } else {
    fill_(out, 0.0);
  }
  if (!bias.defined() && !gelu) return;
  const int64_t n = out.numel();
  dispatch_gpu_float(dtype, op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    precis::cuda::launch(bias_gelu_kernel<T>, precis::cuda::grid_for(n), precis::cuda::kBlockSize, 0,
                         precis::cuda::compute_stream(device), static_cast<T*>(out.raw_data()),
                         bias.defined() ? static_cast<const T*>(bias.raw_data()) : nullptr,
                         pre.defined() ? static_cast<T*>(pre.raw_data()) : nullptr,
                         pre.defined() ? pre.strides()[0] : 0, N, out_features, gelu);
  });
  PRECIS_CUDA_CHECK_LAUNCH(op);
}

void linear_param_backward(const Tensor& grad_weight, const Tensor& grad_bias, const Tensor& grad_out,
                           const Tensor& x_in, bool accumulate_weight, bool accumulate_bias) {
  const char* op = "linear backward";
  DType dtype = check_operands(op, {&grad_out, &x_in});
  PRECIS_CHECK(grad_out.dim() == 2 && x_in.dim() == 2 && grad_out.shape()[0] == x_in.shape()[0], op,
               ": output gradient ", describe(grad_out), " and input ", describe(x_in),
               " must be [N, out] and [N, in]");
  const int64_t N = x_in.shape()[0], in = x_in.shape()[1], out_features = grad_out.shape()[1];
  check_gradient_output(op, "grad_weight", grad_weight, dtype, grad_out.device(), {out_features, in});
  if (grad_bias.defined()) check_gradient_output(op, "grad_bias", grad_bias, dtype, grad_out.device(), {out_features});
  if (N == 0) {  // sums of nothing
    if (!accumulate_weight) fill_(grad_weight, 0.0);
    if (grad_bias.defined() && !accumulate_bias) fill_(grad_bias, 0.0);
    return;
  }
  const Tensor g = readable(grad_out), x = readable(x_in);
  const Tensor g_t = transposed(g);
  // db = g summed over its rows, by our column-sum kernel (column_sums.cu), when not fused into dW's product.
  auto bias_sum = [&] { column_sums(grad_bias, g, accumulate_bias); };
  if (grad_weight.numel() > 0) {
    Gemm gemm = row_major_product(op, x.device(), dtype, matrix_of(g_t), matrix_of(x), grad_weight.raw_data(),
                                  out_features, in, N);
    gemm.out_dtype = grad_weight.dtype();
    gemm.accumulate = accumulate_weight;
    // BGRADB writes db in D's type and cannot add to it; and only products that add to nothing are timed.
    const bool fusable =
        grad_bias.defined() && grad_bias.dtype() == grad_weight.dtype() && !accumulate_weight && !accumulate_bias;
    Gemm fused = gemm;
    fused.epilogue = CUBLASLT_EPILOGUE_BGRADB;
    fused.bias = grad_bias.defined() ? grad_bias.raw_data() : nullptr;
    if (fusable && fuse_epilogues() && prefer_fused(fused, [&] {
          run_weight_gradient(gemm, grad_weight);
          bias_sum();
        })) {
      if (try_run(fused)) return;
      note_unfused(fused);
    }
    run_weight_gradient(gemm, grad_weight);
  }
  if (grad_bias.defined()) bias_sum();
}

void linear_gelu_input_backward(const Tensor& grad_pre, const Tensor& grad_out, const Tensor& weight, const Tensor& pre,
                                const Tensor& grad_pre_sums, bool accumulate_sums) {
  const char* op = "linear_gelu backward";
  DType dtype = check_operands(op, {&grad_pre, &grad_out, &weight, &pre});
  PRECIS_CHECK(grad_out.dim() == 2 && weight.dim() == 2 && grad_out.shape()[1] == weight.shape()[0], op,
               ": output gradient ", describe(grad_out), " and weight ", describe(weight),
               " must be [N, out] and [out, in]");
  const int64_t N = grad_out.shape()[0], out_features = weight.shape()[0], in = weight.shape()[1];
  PRECIS_CHECK(grad_pre.shape() == Shape({N, in}) && grad_pre.is_contiguous() && pre.shape() == Shape({N, in}) &&
                   (pre.strides()[1] == 1 || in == 1) && pre.strides()[0] >= in && pre.strides()[0] % 8 == 0,
               op, ": the gradient ", describe(grad_pre), " must be contiguous [", N, ", ", in, "] and the GELU input ",
               describe(pre), " as linear's pre_gelu");
  const bool sums = grad_pre_sums.defined();
  if (sums) check_gradient_output(op, "the column sums", grad_pre_sums, dtype, grad_pre.device(), {in});
  if (grad_pre.numel() == 0) {
    if (sums && !accumulate_sums) fill_(grad_pre_sums, 0.0);
    return;
  }
  if (out_features == 0) {
    fill_(grad_pre, 0.0);
    if (sums && !accumulate_sums) fill_(grad_pre_sums, 0.0);
    return;
  }
  const Tensor g = readable(grad_out), w = readable(weight);
  Gemm gemm = row_major_product(op, grad_pre.device(), dtype, matrix_of(g), matrix_of(w), grad_pre.raw_data(), N, in,
                                out_features);
  auto column_sums_of_grad_pre = [&] {
    if (sums) column_sums(grad_pre_sums, grad_pre, accumulate_sums);
  };
  if (fuse_epilogues()) {
    gemm.epilogue = CUBLASLT_EPILOGUE_DGELU;
    gemm.aux = pre.raw_data();
    gemm.aux_ld = pre.strides()[0];
    if (sums) {
      // DGELU_BGRAD writes the sums in grad_pre's dtype, over what was there: sums in f32, or
      // to be added, go through a scratch vector (timing uses one too, never grad_pre_sums).
      const bool direct = grad_pre_sums.dtype() == dtype && !accumulate_sums;
      const Tensor epilogue_sums = direct ? grad_pre_sums : empty({in}, dtype, grad_pre.device());
      Gemm fused = gemm;
      fused.epilogue = CUBLASLT_EPILOGUE_DGELU_BGRAD;
      fused.bias = epilogue_sums.raw_data();
      if (prefer_fused(fused, [&] {
            if (try_run(gemm)) column_sums(epilogue_sums, grad_pre);
          })) {
        if (try_run(fused)) {
          if (direct) return;
          if (accumulate_sums)
            accumulate_(grad_pre_sums, epilogue_sums);
          else
            copy_(grad_pre_sums, epilogue_sums);
          return;
        }
        note_unfused(fused);
      }
    }
    if (try_run(gemm)) {
      column_sums_of_grad_pre();
      return;
    }
    note_unfused(gemm);
    gemm.epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    gemm.aux = nullptr;
    gemm.aux_ld = 0;
  }
  run(gemm);
  gelu_backward(grad_pre, grad_pre, pre);  // in place: each element reads only itself
  column_sums_of_grad_pre();
}

void gelu_backward(const Tensor& grad_pre, const Tensor& grad_out, const Tensor& pre) {
  const char* op = "linear_gelu backward";
  DType dtype = check_operands(op, {&grad_pre, &grad_out, &pre});
  PRECIS_CHECK(grad_out.dim() == 2 && grad_out.is_contiguous() && grad_pre.shape() == grad_out.shape() &&
                   grad_pre.is_contiguous() && pre.shape() == grad_out.shape() &&
                   (pre.strides()[1] == 1 || pre.shape()[1] == 1),
               op, ": gradients ", describe(grad_pre), " and ", describe(grad_out),
               " must be contiguous [N, out] and the GELU input ", describe(pre), " [N, out] with unit column stride");
  const int64_t rows = grad_out.shape()[0], cols = grad_out.shape()[1], n = rows * cols;
  if (n == 0) return;
  dispatch_gpu_float(dtype, op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    precis::cuda::launch(gelu_backward_kernel<T>, precis::cuda::grid_for(n), precis::cuda::kBlockSize, 0,
                         precis::cuda::compute_stream(grad_out.device()), static_cast<T*>(grad_pre.raw_data()),
                         static_cast<const T*>(grad_out.raw_data()), static_cast<const T*>(pre.raw_data()),
                         pre.strides()[0], rows, cols);
  });
  PRECIS_CUDA_CHECK_LAUNCH(op);
}

void set_fuse_epilogues(bool fuse) { g_fuse_epilogues.store(fuse); }
bool fuse_epilogues() { return g_fuse_epilogues.load(); }

MatmulCacheStats matmul_cache_stats() {
  std::lock_guard<std::mutex> lock(g_cache_mutex);
  MatmulCacheStats stats = g_stats;
  stats.entries = static_cast<int64_t>(g_cache.size());
  return stats;
}

}  // namespace precis::ops::cuda
