// The matmul autotuner (ops/cuda/matmul_autotune.h): timed runs on the compute stream.
#include <algorithm>
#include <limits>
#include <map>
#include <mutex>
#include <tuple>
#include <utility>

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

}  // namespace

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
  for (int c = 0; c < count; ++c) {
    const float ms = fastest_run_ms(p.stream, [&] { run_algo(timed, p, candidates[c].algo); });
    if (c == 0 || ms < best_ms * (1.0 - kAutotuneMargin)) {
      best = c;
      best_ms = ms;
    }
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
