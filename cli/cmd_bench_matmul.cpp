// precis bench matmul: matrix products alone, C[M, N] = A[M, K] B[K, N], over shapes and
// dtypes, each placed on the device's roofline (docs/labs/03-tensor-cores.md):
//   precis bench matmul [--shapes tiny,unaligned,aligned,gpt2-b1,gpt2-b64 or MxNxK,...]
//                       [--dtypes fp32,tf32,fp16,bf16] [--iters 10] [--device auto|cuda|cpu] [--out DIR]
// FLOPs 2 M N K; bytes the op cost model's (ops/op_cost.h: A and B read once, C written once),
// so the intensity is the best a kernel can reach. The roof of each dtype is
// train::device_roofline's: the datasheet peak of a known GPU, else measured; on the CPU one
// measured roof for every dtype, raised to the fastest product when a busy machine measured
// it low (fp16 and bf16 are emulated there: stored in 16 bits,
// multiplied in f32). Timing: cli/bench_common.h's mean_ms.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <limits>
#include <sstream>

#include "cli/bench_common.h"
#include "cli/commands.h"
#include "cli/usage.h"
#include "core/autograd.h"
#include "core/gpu.h"
#include "core/random.h"
#include "ops/matmul.h"
#include "ops/op_cost.h"
#include "train/device_peak.h"
#include "train/svg_plot.h"

namespace precis::cli {

namespace {

struct MatmulShape {
  std::string name;
  int64_t M, N, K;
};

// The named shapes; `aligned` is 4096^3 on a GPU and 1024^3 on the CPU (a 4096^3 product
// takes seconds there). gpt2-b1 / -b64: GPT-2's MLP up-projection (768 -> 3072) on 1 token
// (generation) and on 64.
MatmulShape named_shape(const std::string& name, bool gpu) {
  if (name == "tiny") return {name, 64, 64, 64};
  if (name == "unaligned") return {name, 1000, 1000, 1000};
  if (name == "aligned") return gpu ? MatmulShape{name, 4096, 4096, 4096} : MatmulShape{name, 1024, 1024, 1024};
  if (name == "gpt2-b1") return {name, 1, 3072, 768};
  if (name == "gpt2-b64") return {name, 64, 3072, 768};
  int64_t m = 0, n = 0, k = 0;
  char x1 = 0, x2 = 0;
  std::istringstream in(name);
  in >> m >> x1 >> n >> x2 >> k;
  usage_check(
      in && in.peek() == EOF && x1 == 'x' && x2 == 'x' && m > 0 && n > 0 && k > 0, "bench matmul",
      "--shapes takes tiny, unaligned, aligned, gpt2-b1, gpt2-b64 or MxNxK (e.g. 1000x1000x1000), not '" + name + "'");
  return {name, m, n, k};
}

std::vector<std::string> split(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ','))
    if (!item.empty()) out.push_back(item);
  return out;
}

struct Row {
  MatmulShape shape;
  std::string dtype;
  double ms = 0, tflops = 0, intensity = 0, peak_tflops = 0, roof_tflops = 0;
};

}  // namespace

int bench_matmul_command(const Args& args) {
  Options o = parse_options(args, {"shapes", "dtypes", "iters", "device", "out"}, "bench matmul");
  usage_check(o.positional.empty(), "bench matmul", "takes no positional arguments");
  const Device device = resolve_device(o.get("device", "auto"));
  const int iters = static_cast<int>(o.integer("iters", 10, 1, 1000000));
  std::vector<MatmulShape> shapes;
  for (const std::string& s : split(o.get("shapes", "tiny,unaligned,aligned,gpt2-b1,gpt2-b64")))
    shapes.push_back(named_shape(s, device.is_cuda()));
  const std::vector<std::string> dtypes = split(o.get("dtypes", "fp32,tf32,fp16,bf16"));
  usage_check(!shapes.empty() && !dtypes.empty(), "bench matmul", "--shapes and --dtypes list at least one each");

  std::vector<Row> rows;
  std::vector<train::Roofline> roofs;
  const bool previous_tf32 = ops::allow_tf32();
  for (const std::string& name : dtypes) {
    usage_check(name == "fp32" || name == "tf32" || name == "fp16" || name == "bf16", "bench matmul",
                "--dtypes takes fp32, tf32, fp16 and bf16, not '" + name + "'");
    const bool tf32 = name == "tf32";
    const DType dtype = tf32 ? DType::f32 : parse_dtype(name);
    // The CPU has one roof for every dtype: measure it once.
    const train::Roofline roof =
        device.is_cuda() || roofs.empty() ? train::device_roofline(device, dtype, tf32) : roofs.front();
    roofs.push_back(roof);
    ops::set_allow_tf32(tf32);
    for (const MatmulShape& s : shapes) {
      NoGradGuard no_grad;
      Generator generator(0);
      // Random data: products of zeros run faster on some GPUs.
      Tensor a = rand({s.M, s.K}, dtype, &generator, -1.0, 1.0).to(device);
      Tensor b = rand({s.K, s.N}, dtype, &generator, -1.0, 1.0).to(device);
      Row r{s, name};
      r.ms = mean_ms(device, iters, [&] { ops::matmul(a, b); });
      const OpCost cost = ops::cost::matmul(1, s.M, s.N, s.K, dtype, dtype, dtype).forward;
      r.tflops = cost.flops / (r.ms * 1e9);
      r.intensity = cost.flops / cost.bytes;
      rows.push_back(r);
    }
  }
  ops::set_allow_tf32(previous_tf32);
  if (!device.is_cuda()) {
    // The CPU's roof comes from one small product; on a busy machine a later product can beat
    // it, and a roof below what was reached is no roof: raise it to the best product.
    double best = 0;
    for (const Row& r : rows) best = std::max(best, r.tflops * 1e12);
    if (best > roofs.front().matrix_flops)
      for (train::Roofline& roof : roofs) {
        roof.matrix_flops = roof.vector_flops = best;
        roof.source += "; compute roof raised to the fastest product here";
      }
  }
  for (Row& r : rows) {
    const train::Roofline& roof = roofs[static_cast<size_t>(&r - rows.data()) / shapes.size()];
    r.peak_tflops = roof.matrix_flops / 1e12;
    r.roof_tflops = roof.roof(r.intensity, true) / 1e12;
  }

  std::string table = "precis bench matmul on " + (device.is_cuda() ? cuda_device_name(device.index) : "the CPU") +
                      " (roofs: " + roofs.front().source + ")\n\n";
  table +=
      "| shape | M x N x K | dtype | ms | TFLOP/s | % of peak | FLOPs/byte | roof TFLOP/s | % of roof | bound |\n"
      "|---|---|---|---|---|---|---|---|---|---|\n";
  for (const Row& r : rows) {
    char line[320];
    std::snprintf(
        line, sizeof line, "| %s | %lldx%lldx%lld | %s | %.4f | %.3g | %.1f%% | %.1f | %.3g | %.1f%% | %s |\n",
        r.shape.name.c_str(), static_cast<long long>(r.shape.M), static_cast<long long>(r.shape.N),
        static_cast<long long>(r.shape.K), r.dtype.c_str(), r.ms, r.tflops, 100 * r.tflops / r.peak_tflops, r.intensity,
        r.roof_tflops, 100 * r.tflops / r.roof_tflops, r.roof_tflops < r.peak_tflops ? "memory" : "compute");
    table += line;
  }
  if (!device.is_cuda())
    table +=
        "\nOn the CPU fp16 and bf16 are emulated (16-bit storage, f32 arithmetic) and tf32 is plain f32: their "
        "speeds say nothing about a GPU's. The CPU's roof is measured once (a 512^3 f32 product, a copy) and "
        "raised to the fastest product here where that beat it.\n";
  std::cout << table;

  const std::string dir = o.get("out", "");
  if (!dir.empty()) {
    std::filesystem::create_directories(dir);
    train::write_plot_file(dir + "/matmul.md", "# Matrix products: precis bench matmul\n\n" + table);
    // One roof per dtype (min(peak, intensity x bandwidth)), a point per product.
    std::vector<train::PlotSeries> lines;
    double lo = std::numeric_limits<double>::infinity(), hi = 0;
    for (const Row& r : rows) lo = std::min(lo, r.intensity), hi = std::max(hi, r.intensity);
    for (size_t d = 0; d < dtypes.size(); ++d) {
      train::PlotSeries line{dtypes[d] + " roof", {}, {}};
      const double ridge = roofs[d].ridge(true);
      for (double x : {std::min(lo, ridge) / 2, ridge, std::max(hi, ridge) * 2}) {
        line.x.push_back(x);
        line.y.push_back(roofs[d].roof(x, true) / 1e12);
      }
      lines.push_back(line);
    }
    std::vector<train::PlotPoint> points;
    for (const Row& r : rows) points.push_back({r.shape.name + " " + r.dtype, r.intensity, r.tflops});
    train::write_svg_loglog(dir + "/roofline.svg", "matmul on the roofline: " + roofs.front().source,
                            "arithmetic intensity (FLOPs/byte)", "TFLOP/s", lines, points, {});
    std::cout << "written: " << dir << "/matmul.md, " << dir << "/roofline.svg\n";
  }
  return 0;
}

}  // namespace precis::cli
