// precis bench attention: causal self-attention alone, flash vs reference, over a
// range of sequence lengths at a fixed number of tokens (B * T), as issue 6 asks:
//   precis bench attention [--tokens 16384 | --batch 1,2,...] [--heads 12] [--head-dim 64]
//                          [--seq 512,1024,2048,4096,8192,16384] [--dtype bf16] [--iters 20]
//                          [--impl flash|reference|both] [--out DIR]
// Per length and implementation: forward and forward+backward milliseconds, TFLOP/s
// and the peak memory above what the inputs take. --batch B1,B2,... fixes the batch
// sizes instead of the token count (each B with each T); --out DIR writes the table, the
// log-log slopes of time and memory over T (or over B when one T is given) and their plots. Timing: 3 warm-up runs,
// then 5 rounds of --iters runs, each round timed with CUDA events on the compute stream (host clock and a sync on the
// CPU); the median round's mean per run is reported, the same method as PyTorch's benchmark helpers. Forward+backward
// is the op with autograd recording, then backward from a random output gradient through the op's own backward, which
// writes dq, dk and dv. Those are handed to the node that made q, k and v, as in a model (where a linear layer made
// them); no leaf .grad is filled, since copying three gradients into .grad is not attention's cost (PyTorch's autograd
// hands a fresh gradient to .grad without a copy). FLOPs count the matrix products only, halved for the causal mask
// (what is computed, as FlashAttention's and PyTorch's benchmarks count): forward 4 B H T^2 D / 2, backward 2.5x that.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <limits>
#include <map>
#include <sstream>

#include "cli/bench_common.h"
#include "cli/commands.h"
#include "cli/usage.h"
#include "core/allocator.h"
#include "core/autograd.h"
#include "core/error.h"
#include "core/gpu.h"
#include "core/pinned.h"
#include "core/random.h"
#include "ops/ops.h"
#include "train/svg_plot.h"

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
  double peak_mib = NAN;
  std::string failure;  // e.g. out of memory
};

Timing time_attention(int64_t B, int64_t H, int64_t T, int64_t D, DType dtype, Device device, int iters,
                      ops::AttentionImpl impl) {
  Timing t;
  Generator gen(1);
  auto random = [&] { return randn({B, H, T, D}, DType::f32, &gen).to(dtype).to(device); };
  Tensor q = random(), k = random(), v = random();
  Tensor dout = random();
  // q, k, v as outputs of a node that drops their gradients: the stand-in for the layer
  // that made them, so backward ends where a model's attention backward would.
  Tensor source = zeros({1}, DType::f32, device).set_requires_grad();
  autograd::record(
      "bench attention inputs", {source}, {q, k, v}, [](const BackwardArgs&) { return std::vector<Tensor>{Tensor()}; },
      /*saves_tensors=*/false);
  Allocator& allocator = allocator_for(device);
  synchronize(device);
  const size_t base = allocator.stats().allocated_bytes;
  allocator.reset_peak();
  try {
    auto forward = [&] { return ops::scaled_dot_product_attention(q, k, v, true, 0.0, std::nullopt, nullptr, impl); };
    {
      NoGradGuard no_grad;
      t.forward_ms = mean_ms(device, iters, [&] { forward(); });
    }
    t.total_ms = mean_ms(device, iters, [&] { forward().backward(dout); });
    t.peak_mib = static_cast<double>(allocator.stats().peak_bytes - base) / (1ull << 20);
  } catch (const Error& e) {
    std::string what = e.what();
    t.failure = what.find("out of memory") != std::string::npos ? "out of memory" : what.substr(0, 60);
  }
  return t;
}

// The slope of the least-squares line through (log x, log y): the exponent p of y ~ x^p.
double log_log_slope(const std::vector<double>& x, const std::vector<double>& y) {
  double n = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    if (!(x[i] > 0) || !(y[i] > 0)) continue;
    const double lx = std::log(x[i]), ly = std::log(y[i]);
    n += 1, sx += lx, sy += ly, sxx += lx * lx, sxy += lx * ly;
  }
  const double d = n * sxx - sx * sx;
  return n < 2 || d == 0 ? NAN : (n * sxy - sx * sy) / d;
}

struct Measured {
  int64_t T, B;
  const char* impl;
  Timing t;
};

// With --out: the table, the fitted slopes and two log-log plots (time and peak memory over
// the swept variable: T, or B when one length is given), one line per implementation
// (and per value of the other variable).
void write_attention_lab(const std::string& dir, const std::string& header, const std::string& table,
                         const std::vector<Measured>& rows, bool over_length) {
  std::map<std::string, std::vector<const Measured*>> lines;
  for (const Measured& m : rows)
    if (m.t.failure.empty())
      lines[std::string(m.impl) + (over_length ? " B=" + std::to_string(m.B) : " T=" + std::to_string(m.T))].push_back(
          &m);
  const char* x_name = over_length ? "T" : "B";
  std::string fits = std::string("\n| line | time slope (fwd+bwd ms vs ") + x_name + ") | memory slope (peak MiB vs " +
                     x_name + ") |\n|---|---|---|\n";
  std::vector<train::PlotSeries> time, memory;
  for (const auto& [label, points] : lines) {
    train::PlotSeries ts{label, {}, {}}, ms{label, {}, {}};
    for (const Measured* m : points) {
      const double x = static_cast<double>(over_length ? m->T : m->B);
      ts.x.push_back(x), ts.y.push_back(m->t.total_ms);
      ms.x.push_back(x), ms.y.push_back(m->t.peak_mib);
    }
    const double time_slope = log_log_slope(ts.x, ts.y), memory_slope = log_log_slope(ms.x, ms.y);
    fits += "| " + label + " | " + format("%.2f", time_slope) + " | " + format("%.2f", memory_slope) + " |\n";
    ts.label += " (slope " + format("%.2f", time_slope) + ")";
    ms.label += " (slope " + format("%.2f", memory_slope) + ")";
    time.push_back(ts), memory.push_back(ms);
  }
  std::filesystem::create_directories(dir);
  train::write_plot_file(dir + "/attention.md",
                         "# Attention: precis bench attention\n\n" + header + "\n" + table + fits);
  train::write_svg_loglog(dir + "/attention-time.svg", std::string("attention fwd+bwd time over ") + x_name, x_name,
                          "ms", time, {}, {});
  train::write_svg_loglog(dir + "/attention-memory.svg", std::string("attention peak memory over ") + x_name, x_name,
                          "MiB above the inputs", memory, {}, {});
  std::cout << fits << "written: " << dir << "/attention.md, attention-time.svg, attention-memory.svg\n";
}

}  // namespace

int bench_attention_command(const Args& args) {
  Options o =
      parse_options(args, {"tokens", "batch", "heads", "head-dim", "seq", "dtype", "iters", "device", "impl", "out"},
                    "bench attention");
  std::string which = o.get("impl", "both");
  PRECIS_CHECK(which == "flash" || which == "reference" || which == "both",
               "bench attention: --impl is flash, reference or both, not '", which, "'");
  constexpr int64_t kLarge = std::numeric_limits<int64_t>::max();
  const int64_t tokens = o.integer("tokens", 16384, 1, kLarge), H = o.integer("heads", 12, 1, kLarge),
                D = o.integer("head-dim", 64, 1, kLarge);
  const int iters = static_cast<int>(o.integer("iters", 20, 1, kLarge));
  const std::vector<int64_t> lengths = parse_list(o.get("seq", "512,1024,2048,4096,8192,16384"), "--seq");
  const std::string batch_list = o.get("batch", "");
  usage_check(batch_list.empty() || o.get("tokens", "").empty(), "bench attention",
              "give --tokens (B = tokens / T) or --batch (a list of B), not both");
  const std::vector<int64_t> batches = batch_list.empty() ? std::vector<int64_t>{} : parse_list(batch_list, "--batch");
  const DType dtype = parse_dtype(o.get("dtype", "bf16"));
  const Device device = resolve_device(o.get("device", "cuda"));
  PRECIS_CHECK(tokens > 0 && H > 0 && D > 0 && iters > 0,
               "bench attention: --tokens, --heads, --head-dim and --iters must be positive");
  std::ostringstream header;
  header << "precis bench attention: causal, " << dtype << ", H=" << H << ", D=" << D
         << (batches.empty() ? ", B*T=" + std::to_string(tokens) : std::string(", B and T as listed")) << " on "
         << device << " (" << (device.is_cuda() ? cuda_device_name(device.index) : "cpu") << ")\n";
  const std::string columns =
      "| T | B | impl | fwd ms | fwd TFLOP/s | fwd+bwd ms | fwd+bwd TFLOP/s | peak MiB |\n"
      "|---|---|---|---|---|---|---|---|\n";
  if (which != "reference") {
    // Flash falls back to the reference where it cannot run; say so, and time the reference once.
    const Tensor probe = zeros({1, 1, 1, D}, dtype, device);
    if (auto why = ops::flash_attention_unsupported(probe, probe, probe, 0.0)) {
      header << "flash attention cannot run here (" << *why << "): only the reference is timed\n";
      which = "reference";
    }
  }
  std::cout << header.str() << columns;
  std::string table = columns;
  std::vector<Measured> measured;
  for (int64_t T : lengths) {
    for (int64_t B : batches.empty() ? std::vector<int64_t>{std::max<int64_t>(tokens / T, 1)} : batches) {
      const double fwd_flops = 4.0 * B * H * static_cast<double>(T) * T * D / 2.0;
      for (auto [impl, name] :
           {std::pair{ops::AttentionImpl::flash, "flash"}, std::pair{ops::AttentionImpl::reference, "reference"}}) {
        if (which != "both" && which != name) continue;
        Timing t = time_attention(B, H, T, D, dtype, device, iters, impl);
        char row[256];
        if (!t.failure.empty())
          std::snprintf(row, sizeof row, "| %lld | %lld | %s | %s | | | | |", static_cast<long long>(T),
                        static_cast<long long>(B), name, t.failure.c_str());
        else
          std::snprintf(row, sizeof row, "| %lld | %lld | %s | %.3f | %.3g | %.3f | %.3g | %.2f |",
                        static_cast<long long>(T), static_cast<long long>(B), name, t.forward_ms,
                        fwd_flops / (t.forward_ms * 1e9), t.total_ms, 3.5 * fwd_flops / (t.total_ms * 1e9), t.peak_mib);
        std::cout << row << std::endl;
        table += std::string(row) + "\n";
        measured.push_back({T, B, name, t});
      }
    }
  }
  const std::string dir = o.get("out", "");
  if (!dir.empty()) write_attention_lab(dir, header.str(), table, measured, lengths.size() > 1);
  return 0;
}

}  // namespace precis::cli
