#include "cli/bench_common.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <vector>

#include "core/error.h"
#include "core/gpu.h"
#include "core/op_profile.h"
#include "core/pinned.h"
#include "train/device_peak.h"
#include "train/memory_profile.h"
#include "train/op_table.h"
#include "train/profile_tsv.h"
#include "train/trainer.h"

#if PRECIS_WITH_CUDA
#include "core/cuda/runtime.h"
#endif

namespace precis::cli {

int64_t parse_count(const Options& o, const std::string& name, int64_t fallback, int64_t min,
                    const std::string& command) {
  std::string text = o.get(name, "");
  if (text.empty()) return fallback;
  size_t used = 0;
  int64_t value = -1;
  try {
    value = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  PRECIS_CHECK(used == text.size() && value >= min, command, ": --", name, " must be an integer >= ", min, ", got '",
               text, "'");
  return value;
}

double mean_ms(Device device, int iters, const std::function<void()>& fn) {
  for (int i = 0; i < 3; ++i) fn();
  std::vector<double> rounds;
  for (int round = 0; round < 5; ++round) {
#if PRECIS_WITH_CUDA
    if (device.is_cuda()) {
      cudaStream_t stream = cuda::compute_stream(device);
      cudaEvent_t start = nullptr, stop = nullptr;
      PRECIS_CUDA_CHECK(cudaEventCreate(&start), "bench");
      PRECIS_CUDA_CHECK(cudaEventCreate(&stop), "bench");
      PRECIS_CUDA_CHECK(cudaEventRecord(start, stream), "bench");
      for (int i = 0; i < iters; ++i) fn();
      PRECIS_CUDA_CHECK(cudaEventRecord(stop, stream), "bench");
      PRECIS_CUDA_CHECK(cudaEventSynchronize(stop), "bench");
      float ms = 0.f;
      PRECIS_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop), "bench");
      cudaEventDestroy(start);
      cudaEventDestroy(stop);
      rounds.push_back(static_cast<double>(ms) / iters);
      continue;
    }
#endif
    synchronize(device);
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) fn();
    synchronize(device);
    rounds.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count() /
                     iters);
  }
  std::sort(rounds.begin(), rounds.end());
  return rounds[rounds.size() / 2];
}

std::string format(const char* pattern, double value) {
  char text[64];
  std::snprintf(text, sizeof text, pattern, value);
  return text;
}

void print_phases(const train::SteadyState& s) {
  double phases_ms = 0;
  for (const auto& [name, ms] : s.phase_ms) {
    const bool overlapped = name == "comm";
    if (!overlapped) phases_ms += ms;
    std::printf("  %-12s %8.2f ms %5.1f%%%s\n", name.c_str(), ms, 100.0 * ms / s.ms_per_step,
                overlapped ? "   (during backward and comm_exposed; not added)" : "");
  }
  double other = std::max(0.0, s.ms_per_step - phases_ms);
  std::printf("  %-12s %8.2f ms %5.1f%%   (host time outside the phases)\n", "other", other,
              100.0 * other / s.ms_per_step);
  std::fflush(stdout);
}

void print_profile(train::Trainer& trainer, const OpProfile& profile) {
  const std::filesystem::path out_dir(trainer.config().out_dir);
  const Device device = resolve_device(trainer.config().device, /*quiet=*/true);
  train::print_op_profile(std::cout, profile.steps(),
                          train::device_roofline(device, trainer.policy().compute_dtype, trainer.policy().allow_tf32),
                          (out_dir / "roofline.svg").string());
  train::MemoryOwners owners = train::memory_owners(trainer.model(), trainer.optimizer(), trainer.policy().grad_dtype);
  owners.registered = trainer.registered_memory_bytes();
  train::print_memory_profile(std::cout, profile.steps(), owners, (out_dir / "memory.svg").string());
  const std::string tsv = (out_dir / "profile.tsv").string();
  train::write_profile_tsv(tsv, profile.steps());
  std::cout << "profile.tsv  " << tsv << "\n" << std::flush;
}

void print_bench_profile(train::Trainer& trainer, const OpProfile& profile) {
  std::cout << "profile      the figures above include the profiler's cost (a device sync per step, a timer per op)\n";
  print_profile(trainer, profile);
}

}  // namespace precis::cli
