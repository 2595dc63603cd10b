#include "amp/numerics.h"

#include <cmath>
#include <cstdio>

#if PRECIS_WITH_CUDA
#include "amp/cuda/numerics.h"
#endif

namespace precis::amp {

const char* numerics_kind_name(NumericsKind kind) {
  switch (kind) {
    case NumericsKind::activation:
      return "activation";
    case NumericsKind::activation_grad:
      return "act grad";
    case NumericsKind::gradient:
      return "gradient";
    case NumericsKind::update:
      return "update";
  }
  return "?";
}

void TensorNumerics::add_values(const Tensor& t) {
#if PRECIS_WITH_CUDA
  if (t.is_cuda()) return cuda::add_values(t, *this);
#endif
  std::vector<double> v = t.to_vector<double>();
  count += static_cast<int64_t>(v.size());
  for (double x : v) {
    if (std::isnan(x)) {
      ++nan;
      continue;
    }
    if (std::isinf(x)) {
      ++inf;
      continue;
    }
    double a = std::abs(x);
    max_abs = std::max(max_abs, a);
    if (a == 0)
      ++zero;
    else if (a < kFp16MinNormal) {
      ++fp16_subnormal;
      if (a < kFp16HalfMinSubnormal) ++fp16_underflow;
    }
  }
}

void TensorNumerics::add_update(const Tensor& before, const Tensor& after, const Tensor& grad) {
#if PRECIS_WITH_CUDA
  if (after.is_cuda()) return cuda::add_update(before, after, grad, *this);
#endif
  std::vector<double> b = before.to_vector<double>(), a = after.to_vector<double>(), g = grad.to_vector<double>();
  for (size_t i = 0; i < a.size(); ++i) {
    double delta = a[i] - b[i];
    ++count;
    max_abs = std::max(max_abs, std::abs(delta));
    if (delta == 0) ++zero;
    if (g[i] != 0 && std::isfinite(g[i])) {
      ++eligible;
      if (delta == 0) ++lost;
    }
  }
}

Json TensorNumerics::json() const {
  Json j = Json::object();
  double n = static_cast<double>(std::max<int64_t>(count, 1));
  j["count"] = count;
  j["max_abs"] = max_abs;
  j["zero"] = zero / n;
  j["fp16_subnormal"] = fp16_subnormal / n;
  j["fp16_underflow"] = fp16_underflow / n;
  j["inf"] = inf / n;
  j["nan"] = nan / n;
  if (eligible > 0) j["lost"] = static_cast<double>(lost) / static_cast<double>(eligible);
  return j;
}

std::string layer_of(const std::string& name) {
  // transformer.h.<i>.<...> -> transformer.h.<i>; otherwise drop the last component.
  const std::string blocks = "transformer.h.";
  if (name.rfind(blocks, 0) == 0) {
    size_t end = name.find('.', blocks.size());
    return end == std::string::npos ? name : name.substr(0, end);
  }
  size_t dot = name.rfind('.');
  return dot == std::string::npos ? name : name.substr(0, dot);
}

NumericsReport::Row& NumericsReport::row(NumericsKind kind, const std::string& name) {
  for (auto& r : rows_)
    if (r.kind == kind && r.name == name) return r;
  rows_.push_back({kind, name, {}});
  return rows_.back();
}

void NumericsReport::record(NumericsKind kind, const std::string& name, const Tensor& t) {
  row(kind, name).stats.add_values(t);
}

void NumericsReport::record_update(const std::string& name, const Tensor& before, const Tensor& after,
                                   const Tensor& grad) {
  row(NumericsKind::update, name).stats.add_update(before, after, grad);
}

std::string NumericsReport::table(int64_t step, double loss_scale) const {
  std::string out;
  char line[256];
  std::snprintf(line, sizeof line, "numerics at step %lld (loss scale %g; gradients as stored, i.e. scaled)\n",
                static_cast<long long>(step), loss_scale);
  out += line;
  std::snprintf(line, sizeof line, "  %-10s %-22s %10s %7s %9s %9s %7s %7s %7s\n", "kind", "layer", "max|x|", "zero",
                "fp16 sub", "fp16 0", "inf", "nan", "lost");
  out += line;
  for (const auto& r : rows_) {
    const TensorNumerics& s = r.stats;
    double n = static_cast<double>(std::max<int64_t>(s.count, 1));
    char lost[16] = "-";
    if (s.eligible > 0) std::snprintf(lost, sizeof lost, "%6.2f%%", 100.0 * s.lost / s.eligible);
    std::snprintf(line, sizeof line, "  %-10s %-22s %10.3e %6.2f%% %8.2f%% %8.2f%% %6.2f%% %6.2f%% %7s\n",
                  numerics_kind_name(r.kind), r.name.c_str(), s.max_abs, 100.0 * s.zero / n,
                  100.0 * s.fp16_subnormal / n, 100.0 * s.fp16_underflow / n, 100.0 * s.inf / n, 100.0 * s.nan / n,
                  lost);
    out += line;
  }
  return out;
}

std::vector<Json> NumericsReport::json(int64_t step, double loss_scale) const {
  std::vector<Json> out;
  for (const auto& r : rows_) {
    Json j = r.stats.json();
    Json rec = Json::object();
    rec["step"] = step;
    rec["loss_scale"] = loss_scale;
    rec["kind"] = numerics_kind_name(r.kind);
    rec["name"] = r.name;
    for (auto& [k, v] : j.as_object()) rec[k] = v;
    out.push_back(rec);
  }
  return out;
}

}  // namespace precis::amp
