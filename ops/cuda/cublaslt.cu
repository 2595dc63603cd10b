// cuBLASLt products (ops/cuda/cublaslt.h): per-device handle, the descriptors of a Gemm, the
// per-problem cache of the algorithm to run, and each call's workspace: what its algorithm
// needs, from the caching allocator for the call (stream-ordered, as the convolutions' in
// conv.cu), not a fixed block of kWorkspaceBytes held for the process, which sat in every peak
// whether an algorithm needed it or not.
#include <algorithm>
#include <iostream>
#include <map>
#include <mutex>
#include <set>
#include <utility>

#include "core/allocator.h"
#include "core/cuda/graph_memsets.h"
#include "core/cuda/runtime.h"
#include "ops/cuda/cublas_check.h"
#include "ops/cuda/cublaslt.h"
#include "ops/cuda/matmul.h"
#include "ops/cuda/matmul_autotune.h"
#include "ops/matmul.h"

namespace precis::ops::cuda::cublaslt {

namespace {

// Per-device cuBLASLt state, made on first use (never at program start: a
// machine without a driver must not touch CUDA).

struct DeviceState {
  cublasLtHandle_t handle = nullptr;
};

DeviceState& device_state(Device device) {
  static std::mutex mutex;
  static std::map<int, DeviceState> states;  // kept until the process ends
  std::lock_guard<std::mutex> lock(mutex);
  DeviceState& state = states[device.index];
  if (!state.handle) {
    precis::cuda::set_device(device);
    PRECIS_CUBLAS_CHECK(cublasLtCreate(&state.handle), "matmul: creating the cuBLASLt handle of ", device);
  }
  return state;
}

// A call's workspace of `bytes` from the device's caching allocator (none for 0 bytes), freed
// when the call has been queued: later work on the compute stream, which may reuse it, runs
// after the product.
Tensor workspace_for(Device device, size_t bytes) {
  return bytes == 0 ? Tensor() : empty({static_cast<int64_t>(bytes)}, DType::u8, device);
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

// The largest power of two, up to 256, dividing the address and every stride
// in bytes: the alignment the heuristic may count on for that operand.
uint32_t alignment(const void* data, size_t element_bytes, std::initializer_list<int64_t> strides) {
  uint64_t bits = reinterpret_cast<uintptr_t>(data) | 256u;
  for (int64_t s : strides) bits |= static_cast<uint64_t>(s) * element_bytes;
  return static_cast<uint32_t>(bits & (~bits + 1));
}

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
  size_t workspace_bytes = 0;  // what the algorithm needs (the heuristic's answer)
};

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

}  // namespace

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

void run_algo(const Gemm& g, const Problem& p, const cublasLtMatmulAlgo_t& algo) {
  const float alpha = 1.0f, beta = g.accumulate ? 1.0f : 0.0f;
  PRECIS_CUBLAS_CHECK(cublasLtMatmul(p.handle, p.desc, &alpha, g.a, p.a, g.b, p.b, &beta, g.d, p.d, g.d, p.d, &algo,
                                     p.workspace, p.workspace_bytes, p.stream),
                      g.op, " ", g.problem());
}

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
                        nullptr,
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
      const bool tune = worth_autotuning(g) && !precis::cuda::is_capturing(problem.stream);
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
        int chosen = 0;
        if (found > 1) {  // timed, each candidate with the workspace it asks for
          size_t most = 0;
          for (int c = 0; c < found; ++c) most = std::max(most, results[c].workspaceSize);
          const Tensor workspace = workspace_for(g.device, most);
          Problem timed = problem;
          timed.workspace = workspace.defined() ? workspace.raw_data() : nullptr;
          timed.workspace_bytes = most;
          chosen = fastest(g, timed, results, found);
        }
        cached.algo = results[chosen].algo;
        cached.workspace_bytes = results[chosen].workspaceSize;
        if (found > 1) ++g_stats.autotuned;
      }
      g_cache.emplace(key, cached);
    }
  }
  if (!cached.found) return false;
  Problem run = problem;
  const precis::cuda::CaptureWorkspace slice(g.device, problem.stream, cached.workspace_bytes);
  const Tensor workspace = slice.data() ? Tensor() : workspace_for(g.device, cached.workspace_bytes);
  run.workspace = slice.data() ? slice.data() : workspace.defined() ? workspace.raw_data() : nullptr;
  run.workspace_bytes = cached.workspace_bytes;
  run_algo(g, run, cached.algo);
  return true;
}

void run(const Gemm& g) { PRECIS_CHECK(try_run(g), g.op, ": cuBLASLt has no algorithm for ", g.problem()); }

void note_unfused(const Gemm& g) {
  static std::mutex mutex;
  static std::set<int> noted;
  std::lock_guard<std::mutex> lock(mutex);
  if (!noted.insert(static_cast<int>(g.epilogue)).second) return;
  std::cerr << "note: " << g.op << ": cuBLASLt has no algorithm for " << g.problem()
            << "; a separate kernel does the epilogue's work (said once)\n";
}

}  // namespace precis::ops::cuda::cublaslt

namespace precis::ops::cuda {

MatmulCacheStats matmul_cache_stats() {
  std::lock_guard<std::mutex> lock(cublaslt::g_cache_mutex);
  MatmulCacheStats stats = cublaslt::g_stats;
  stats.entries = static_cast<int64_t>(cublaslt::g_cache.size());
  return stats;
}

}  // namespace precis::ops::cuda
