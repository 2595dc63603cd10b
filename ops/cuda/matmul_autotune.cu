// The matmul autotuner (ops/cuda/matmul_autotune.h): timed runs on the compute stream.
#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <limits>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "core/cuda/runtime.h"
#include "core/cuda/timed_runs.h"
#include "ops/cuda/matmul_autotune.h"
#include "ops/matmul.h"

namespace precis::ops::cuda::cublaslt {

namespace {

constexpr int kAutotuneRuns = 3;  // after one untimed run; the fastest of the runs counts
constexpr double kAutotuneMargin = 0.02;
constexpr double kAutotuneMinFlops = 2.0 * 256 * 256 * 256;  // smaller products are launch-bound

// The fastest of kAutotuneRuns timed runs of `work` on `stream`, after one untimed run.
template <typename Work>
float fastest_run_ms(cudaStream_t stream, Work&& work) {
  return precis::cuda::fastest_run_ms(stream, kAutotuneRuns, "matmul autotune", std::forward<Work>(work));
}

// Trial (bench/NOTES.md, thirteenth session; temporary). In a replayed step each memset node
// cuBLASLt queues before a product (a 4-byte counter in its workspace, for 99 of GPT-2's 160
// products) costs ~4 us: ~1.3 us of gap before it, ~0.8 it, ~2.2 after it, where a product
// after one of our kernels with no memset between starts at once. PRECIS_AB_MEMSET_PENALTY_US
// adds that many microseconds to a candidate's time per memset node it queues, so a candidate
// without one wins where it is within that of the fastest. PRECIS_AB_AUTOTUNE_REPORT=1 prints
// each timed problem's choice.
double env_number(const char* name, double fallback) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return fallback;
  char* end = nullptr;
  const double number = std::strtod(value, &end);
  PRECIS_CHECK(end != value && *end == '\0' && number >= 0, name, " is '", value, "': give a number >= 0, or unset it");
  return number;
}

double memset_penalty_ms() {
  static const double ms = env_number("PRECIS_AB_MEMSET_PENALTY_US", 0.0) / 1000.0;
  return ms;
}

bool autotune_report() {
  static const bool on = env_number("PRECIS_AB_AUTOTUNE_REPORT", 0.0) != 0.0;
  return on;
}

// The memset nodes cuBLASLt queues with one run of `algo`: the run captured into a throwaway
// graph on p.stream (never launched), in this thread's capture mode so no other thread's
// work is refused meanwhile. Each node's target goes to `targets` (where given): its offset
// in the workspace ("ws+OFFSET") or "elsewhere", and its bytes.
int memset_nodes(const Gemm& g, const Problem& p, const cublasLtMatmulAlgo_t& algo, std::string* targets = nullptr) {
  const char* op = "matmul autotune: counting memset nodes";
  PRECIS_CUDA_CHECK(cudaStreamBeginCapture(p.stream, cudaStreamCaptureModeThreadLocal), op);
  std::string failure;
  try {
    run_algo(g, p, algo);
  } catch (const std::exception& e) {
    failure = e.what();
  }
  cudaGraph_t graph = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(p.stream, &graph);
  int memsets = 0;
  if (failure.empty() && ended == cudaSuccess && graph != nullptr) {
    size_t count = 0;
    PRECIS_CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &count), op);
    std::vector<cudaGraphNode_t> nodes(count);
    PRECIS_CUDA_CHECK(cudaGraphGetNodes(graph, nodes.data(), &count), op);
    for (cudaGraphNode_t node : nodes) {
      cudaGraphNodeType type;
      if (cudaGraphNodeGetType(node, &type) != cudaSuccess) {
        cudaGetLastError();  // a node the runtime cannot name (core/cuda/cuda_graph.cu)
        continue;
      }
      if (type != cudaGraphNodeTypeMemset) continue;
      ++memsets;
      cudaMemsetParams params{};
      if (targets != nullptr && cudaGraphMemsetNodeGetParams(node, &params) == cudaSuccess) {
        const auto* base = static_cast<const char*>(p.workspace);
        const auto* dst = static_cast<const char*>(params.dst);
        const bool inside = dst >= base && dst < base + kWorkspaceBytes;
        *targets += (inside ? " ws+" + std::to_string(dst - base) : std::string(" elsewhere")) + ":" +
                    std::to_string(params.elementSize * params.width * params.height) + "B";
      }
    }
  }
  if (graph != nullptr) cudaGraphDestroy(graph);
  PRECIS_CHECK(failure.empty(), op, ": ", failure);
  PRECIS_CUDA_CHECK(ended, op);
  return memsets;
}

}  // namespace

int autotune_candidates() {
  static const int n = [] {
    const double asked = env_number("PRECIS_AB_AUTOTUNE_CANDIDATES", kAutotuneCandidates);
    PRECIS_CHECK(asked >= 1 && asked <= kMaxAutotuneCandidates && asked == static_cast<int>(asked),
                 "PRECIS_AB_AUTOTUNE_CANDIDATES is ", asked, ": give a whole number from 1 to ",
                 kMaxAutotuneCandidates);
    return static_cast<int>(asked);
  }();
  return n;
}

bool autotune_without_workspace() {
  static const bool on = env_number("PRECIS_AB_AUTOTUNE_NO_WORKSPACE", 0.0) != 0.0;
  return on;
}

bool worth_autotuning(const Gemm& g) {
  const double flops = 2.0 * static_cast<double>(g.m) * static_cast<double>(g.n) * static_cast<double>(g.k) *
                       static_cast<double>(g.batch);
  return matmul_autotune() && flops >= kAutotuneMinFlops;
}

int fastest(const Gemm& g, const Problem& p, const cublasLtMatmulHeuristicResult_t* candidates, int count) {
  Gemm timed = g;
  Tensor scratch;
  if (g.accumulate) {
    scratch = zeros({(g.batch - 1) * g.stride_d + g.ldd * g.n}, g.out_dtype, g.device);
    timed.d = scratch.raw_data();
  }
  int best = 0;
  float best_ms = 0;
  std::vector<float> times(count);
  std::vector<int> memsets(count, 0);
  std::vector<std::string> targets(count);
  const bool count_memsets = memset_penalty_ms() > 0 || autotune_report();
  for (int c = 0; c < count; ++c) {
    times[c] = fastest_run_ms(p.stream, [&] { run_algo(timed, p, candidates[c].algo); });
    if (count_memsets) memsets[c] = memset_nodes(timed, p, candidates[c].algo, &targets[c]);
    const float ms = times[c] + static_cast<float>(memsets[c] * memset_penalty_ms());
    if (c == 0 || ms < best_ms * (1.0 - kAutotuneMargin)) {
      best = c;
      best_ms = ms;
    }
  }
  if (autotune_report()) {
    int fastest_plain = -1;  // the fastest candidate that queues no memset
    for (int c = 0; c < count; ++c)
      if (memsets[c] == 0 && (fastest_plain < 0 || times[c] < times[fastest_plain])) fastest_plain = c;
    std::ostringstream line;
    line << "autotune " << g.problem() << ": chose #" << best << " of " << count << " (" << times[best] * 1e3 << " us, "
         << memsets[best] << " memsets" << targets[best] << ", " << candidates[best].workspaceSize
         << " B of workspace); #0 " << times[0] * 1e3 << " us, " << memsets[0]
         << " memsets; fastest without a memset: ";
    if (fastest_plain < 0)
      line << "none";
    else
      line << "#" << fastest_plain << " " << times[fastest_plain] * 1e3 << " us ("
           << candidates[fastest_plain].workspaceSize << " B of workspace)";
    std::cerr << line.str() << "\n";
  }
  return best;
}

bool prefer_fused(const Gemm& fused, const std::function<void()>& split) {
  static std::mutex mutex;
  static std::map<std::tuple<int, int, int, int, int64_t, int64_t, int64_t>, bool> choices;
  PRECIS_CHECK(!fused.accumulate, fused.op, ": cannot time ", fused.problem(), " on its real output");
  if (!worth_autotuning(fused)) return true;
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

}  // namespace precis::ops::cuda::cublaslt
