// precis formats [VALUE ...] [--out DIR]: each value rounded into fp32, tf32, fp16, bf16 and
// the two fp8 formats (amp/float_format.h), with its bits, rounding error, class and the gaps
// to its neighbours; the formats' parameters; a plot of the relative gap between neighbours
// over magnitude (docs/labs/01-formats.md).
#include <charconv>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>

#include "amp/float_format.h"
#include "cli/bench_common.h"
#include "cli/commands.h"
#include "cli/usage.h"
#include "train/svg_plot.h"

namespace precis::cli {

namespace {

using amp::FloatClass;
using amp::FloatFormat;

std::string hex(const FloatFormat& f, uint32_t bits) {
  // tf32 lives in an fp32 register: its 19 bits are the top of the word, the low 13 zero.
  const int shift = f.container_bits - f.total_bits();
  char text[16];
  std::snprintf(text, sizeof text, "0x%0*X", f.container_bits / 4, bits << shift);
  return text;
}

std::string formats_table() {
  std::string out =
      "| format | sign/exponent/mantissa bits | significant bits | decimal digits | largest | smallest normal | "
      "smallest subnormal | eps (gap above 1) |\n|---|---|---|---|---|---|---|---|\n";
  for (const FloatFormat& f : amp::float_formats())
    out += "| " + f.name + " | 1/" + std::to_string(f.exponent_bits) + "/" + std::to_string(f.mantissa_bits) + " | " +
           std::to_string(f.mantissa_bits + 1) + " | " + format("%.1f", (f.mantissa_bits + 1) * std::log10(2.0)) +
           " | " + format("%.6g", f.max_finite()) + " | " + format("%.3g", f.min_normal()) + " | " +
           format("%.3g", f.min_subnormal()) + " | " + format("%.3g", f.epsilon()) + " |\n";
  return out;
}

std::string class_text(const FloatFormat& f, const amp::Rounded& r) {
  if (r.kind == FloatClass::overflow)
    return f.ieee_top ? "overflow: inf" : "overflow: NaN (saturating casts give " + format("%g", f.max_finite()) + ")";
  if (r.flushed) return "underflow: 0";
  return amp::float_class_name(r.kind);
}

std::string value_table(double x) {
  std::string out =
      "| format | stored | bits (sign exponent mantissa) | hex | abs error | rel error | class | gap below / above "
      "|\n|---|---|---|---|---|---|---|---|\n";
  for (const FloatFormat& f : amp::float_formats()) {
    const amp::Rounded r = amp::round_to(f, x);
    const bool finite = std::isfinite(r.value);
    const double error = std::fabs(r.value - x);
    out += "| " + f.name + " | " + format("%.9g", r.value) + " | `" + amp::bit_fields(f, r.bits) + "` | " +
           hex(f, r.bits) + " | " + (finite ? format("%.3g", error) : "-") + " | " +
           (finite && x != 0 ? format("%.3g", error / std::fabs(x)) : "-") + " | " + class_text(f, r) + " | " +
           (finite ? format("%.3g", r.gap_below) + " / " + format("%.3g", r.gap_above) : "-") + " |\n";
  }
  return out;
}

std::string why_loss_scaling() {
  const FloatFormat& fp16 = amp::float_format("fp16");
  const FloatFormat& bf16 = amp::float_format("bf16");
  return "Why bf16 needs no loss scaling and fp16 does: bf16 keeps fp32's 8 exponent bits, so every value from " +
         format("%.2g", bf16.min_normal()) + " to " + format("%.2g", bf16.max_finite()) +
         " is a normal number with all of its " + std::to_string(bf16.mantissa_bits + 1) +
         " significant bits: a gradient of 1e-8 is stored with a relative error under " +
         format("%.2g", bf16.epsilon() / 2) + ". fp16 has 5 exponent bits: below " + format("%.2g", fp16.min_normal()) +
         " a value is subnormal and loses significant bits, below " + format("%.2g", fp16.min_subnormal() / 2) +
         " it rounds to 0, and above " + format("%g", fp16.max_finite()) +
         " it overflows to inf. Gradients of a language model sit largely below 1e-4, so in fp16 many lose "
         "precision or vanish; multiplying the loss by S (e.g. 2^16) lifts them into the normal range, and the "
         "optimizer divides by S in fp32. fp16 gives up range for precision: " +
         std::to_string(fp16.mantissa_bits + 1) + " significant bits to bf16's " +
         std::to_string(bf16.mantissa_bits + 1) + ": 8x finer steps, which is why it is still used.\n";
}

// The relative gap to the next value, gap / |x|, over magnitudes 1e-10 .. 1e6, one line per format.
void write_gap_plot(const std::string& path, const std::vector<double>& values) {
  std::vector<train::PlotSeries> lines;
  for (const FloatFormat& f : amp::float_formats()) {
    train::PlotSeries s{f.name, {}, {}};
    for (int k = -400; k <= 240; ++k) {
      const double x = std::pow(10.0, k / 40.0);
      const amp::Rounded r = amp::round_to(f, x);
      if (r.kind != FloatClass::normal && r.kind != FloatClass::subnormal) continue;
      s.x.push_back(x);
      s.y.push_back(r.gap_above / std::fabs(r.value));
    }
    lines.push_back(s);
  }
  std::vector<train::PlotPoint> marks;
  for (double v : values)
    if (v > 0) marks.push_back({format("%g", v), v, 0});
  train::write_svg_loglog(path, "relative gap between neighbouring values (ulp / |x|)", "|x|", "gap / |x|", lines, {},
                          marks);
}

}  // namespace

int formats_command(const Args& args) {
  Options o = parse_options(args, {"out"}, "formats");
  std::vector<double> values;
  for (const std::string& text : o.positional) {
    double v = 0;
    const char* end = text.data() + text.size();
    auto [stop, error] = std::from_chars(text.data(), end, v);
    usage_check(error == std::errc() && stop == end, "formats", "'" + text + "' is not a number (e.g. 3.14159, 1e-8)");
    values.push_back(v);
  }
  if (values.empty()) values = {3.14159, 1e-8, 65504, 70000, 1e-5, 448, 0.1};
  std::string report =
      "Rounded to nearest, ties to even; fp16 and bf16 from the value's fp32 rounding, as a cast "
      "on the GPU does.\n\n## The formats\n\n" +
      formats_table();
  for (double x : values) report += "\n## " + format("%.9g", x) + "\n\n" + value_table(x);
  report += "\n" + why_loss_scaling();
  std::cout << report;
  const std::string dir = o.get("out", "");
  if (!dir.empty()) {
    std::filesystem::create_directories(dir);
    train::write_plot_file(dir + "/formats.md", "# Number formats: precis formats\n\n" + report);
    write_gap_plot(dir + "/formats.svg", values);
    std::cout << "written: " << dir << "/formats.md, " << dir << "/formats.svg\n";
  }
  return 0;
}

}  // namespace precis::cli
