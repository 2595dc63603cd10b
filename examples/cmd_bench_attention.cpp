// precis bench attention: causal self-attention alone, flash vs reference, over a
// range of sequence lengths at a fixed number of tokens (B * T), as issue 6 asks:
//   precis bench attention [--tokens 16384] [--heads 12] [--head-dim 64]
//                          [--seq 512,1024,2048,4096,8192,16384] [--dtype bf16] [--iters 20]
// Per length and implementation: forward and forward+backward milliseconds (the mean
// of --iters runs after 3 warm-up runs, timed with a device sync at both ends),
// TFLOP/s and the peak memory above what the inputs take. FLOPs count the matrix
// products only, halved for the causal mask (what is computed, as FlashAttention's
// and PyTorch's benchmarks count): forward 4 B H T^2 D / 2, backward 2.5x that.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <sstream>

#include "core/allocator.h"
#include "core/error.h"
#include "core/gpu.h"
#include "core/random.h"
#include "examples/commands.h"
#include "ops/ops.h"

#if PRECIS_WITH_CUDA
#include "core/cuda/runtime.h"
#endif

namespace precis::cli {

namespace {

std::vector<int64_t> parse_list(const std::string& text, const char* what) {
  std::vector<int64_t> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    try {
      out.push_back(std::stoll(item));
    } catch (const std::exception&) {
      PRECIS_FAIL("bench attention: ", what, " takes comma-separated integers, got '", text, "'");
    }
    PRECIS_CHECK(out.back() > 0, "bench attention: ", what, " values must be positive, got ", out.back());
  }
  return out;
}

struct Timing {
  double forward_ms = NAN, total_ms = NAN;  // total: forward + backward
  double peak_gib = NAN;
  std::string failure;  // e.g. out of memory
};

void sync(Device device) {
#if PRECIS_WITH_CUDA
  if (device.is_cuda()) cuda::synchronize(device);
#else
  (void)device;
#endif
}

template <typename Fn>
double mean_ms(Device device, int iters, Fn&& fn) {
  for (int i = 0; i < 3; ++i) fn();
  sync(device);
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) fn();
  sync(device);
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count() / iters;
}

Timing time_attention(int64_t B, int64_t H, int64_t T, int64_t D, DType dtype, Device device, int iters,
                      ops::AttentionImpl impl) {
  Timing t;
  Generator gen(1);
  auto random = [&] { return randn({B, H, T, D}, DType::f32, &gen).to(dtype).to(device); };
  Tensor q = random().set_requires_grad(), k = random().set_requires_grad(), v = random().set_requires_grad();
  Tensor dout = random();
  Allocator& allocator = allocator_for(device);
  sync(device);
  const size_t base = allocator.stats().allocated_bytes;
  allocator.reset_peak();
  try {
    auto forward = [&] {
      return ops::scaled_dot_product_attention(q, k, v, true, 0.0, std::nullopt, nullptr, impl);
    };
    {
      NoGradGuard no_grad;
      t.forward_ms = mean_ms(device, iters, [&] { forward(); });
    }
    t.total_ms = mean_ms(device, iters, [&] {
      q.zero_grad();
      k.zero_grad();
      v.zero_grad();
      forward().backward(dout);
    });
    t.peak_gib = static_cast<double>(allocator.stats().peak_bytes - base) / (1ull << 30);
  } catch (const Error& e) {
    std::string what = e.what();
    t.failure = what.find("out of memory") != std::string::npos ? "out of memory" : what.substr(0, 60);
  }
  return t;
}

}  // namespace

int bench_attention_command(const Args& args) {
  Options o = parse_options(args, {"tokens", "heads", "head-dim", "seq", "dtype", "iters", "device"},
                            "bench attention");
  const int64_t tokens = std::stoll(o.get("tokens", "16384")), H = std::stoll(o.get("heads", "12")),
                D = std::stoll(o.get("head-dim", "64"));
  const int iters = std::stoi(o.get("iters", "20"));
  const std::vector<int64_t> lengths = parse_list(o.get("seq", "512,1024,2048,4096,8192,16384"), "--seq");
  const DType dtype = parse_dtype(o.get("dtype", "bf16"));
  const Device device = resolve_device(o.get("device", "cuda"));
  PRECIS_CHECK(tokens > 0 && H > 0 && D > 0 && iters > 0,
               "bench attention: --tokens, --heads, --head-dim and --iters must be positive");
  std::cout << "precis bench attention: causal, " << dtype << ", H=" << H << ", D=" << D << ", B*T=" << tokens
            << " on " << device << " (" << (device.is_cuda() ? cuda_device_name(device.index) : "cpu") << ")\n"
            << "| T | B | impl | fwd ms | fwd TFLOP/s | fwd+bwd ms | fwd+bwd TFLOP/s | peak GiB |\n"
            << "|---|---|---|---|---|---|---|---|\n";
  for (int64_t T : lengths) {
    const int64_t B = std::max<int64_t>(tokens / T, 1);
    const double fwd_flops = 4.0 * B * H * static_cast<double>(T) * T * D / 2.0;
    for (auto [impl, name] :
         {std::pair{ops::AttentionImpl::flash, "flash"}, std::pair{ops::AttentionImpl::reference, "reference"}}) {
      Timing t = time_attention(B, H, T, D, dtype, device, iters, impl);
      char row[256];
      if (!t.failure.empty())
        std::snprintf(row, sizeof row, "| %lld | %lld | %s | %s | | | | |", static_cast<long long>(T),
                      static_cast<long long>(B), name, t.failure.c_str());
      else
        std::snprintf(row, sizeof row, "| %lld | %lld | %s | %.3f | %.0f | %.3f | %.0f | %.2f |",
                      static_cast<long long>(T), static_cast<long long>(B), name, t.forward_ms,
                      fwd_flops / (t.forward_ms * 1e9), t.total_ms, 3.5 * fwd_flops / (t.total_ms * 1e9), t.peak_gib);
      std::cout << row << std::endl;
    }
  }
  return 0;
}

}  // namespace precis::cli
