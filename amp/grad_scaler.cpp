#include "amp/grad_scaler.h"

#if PRECIS_WITH_CUDA
#include "amp/cuda/grad_scaler.h"
#endif

#include <algorithm>
#include <cmath>

#include "core/convert.h"
#include "core/copy.h"
#include "core/strided_loop.h"
#include "ops/elementwise.h"

namespace precis::amp {

const char* scaler_mode_name(ScalerMode mode) { return mode == ScalerMode::dynamic ? "dynamic" : "fixed"; }

ScalerMode parse_scaler_mode(const std::string& name) {
  if (name == "dynamic") return ScalerMode::dynamic;
  if (name == "fixed" || name == "static") return ScalerMode::fixed;
  PRECIS_FAIL("GradScaler: unknown mode '", name, "'; expected dynamic or fixed (also spelled static)");
}

GradScaler::GradScaler(GradScalerOptions options) : options_(options), scale_(options.init_scale) {
  const GradScalerOptions& o = options_;
  PRECIS_CHECK(std::isfinite(o.init_scale) && o.init_scale > 0, "GradScaler: init_scale must be a finite number > 0, got ",
               o.init_scale);
  PRECIS_CHECK(o.growth_factor > 1 && std::isfinite(o.growth_factor), "GradScaler: growth_factor must be > 1, got ",
               o.growth_factor);
  PRECIS_CHECK(o.backoff_factor > 0 && o.backoff_factor < 1, "GradScaler: backoff_factor must be in (0, 1), got ",
               o.backoff_factor);
  PRECIS_CHECK(o.growth_interval >= 1, "GradScaler: growth_interval must be >= 1 step, got ", o.growth_interval);
  PRECIS_CHECK(o.hysteresis >= 1, "GradScaler: hysteresis must be >= 1 overflow step, got ", o.hysteresis);
  PRECIS_CHECK(o.min_scale > 0 && o.max_scale >= o.min_scale && std::isfinite(o.max_scale),
               "GradScaler: need 0 < min_scale <= max_scale (finite), got min_scale ", o.min_scale, ", max_scale ",
               o.max_scale);
  PRECIS_CHECK(o.mode == ScalerMode::fixed || (o.init_scale >= o.min_scale && o.init_scale <= o.max_scale),
               "GradScaler: init_scale ", o.init_scale, " is outside [min_scale, max_scale] = [", o.min_scale, ", ",
               o.max_scale, "]");
}

Tensor GradScaler::scale(const Tensor& loss) const {
  if (!options_.enabled) return loss;
  bool narrow = loss.dtype() == DType::f16 || loss.dtype() == DType::bf16;
  const Tensor wide = narrow ? ops::cast(loss, DType::f32) : loss;
  // On the device the factor is read from memory, so a replayed CUDA graph sees the current scale.
  return on_device() ? ops::mul(wide, device_scale_f32_) : ops::mul(wide, scale_);
}

namespace {

// Unscale and check in one pass, C = compute_type_t<T> (f32 for f16/bf16):
//   found = any_i !isfinite(g[i]);   g[i] <- T(C(g[i]) * inv_scale)
template <typename T>
bool unscale_and_check_inf(T* g, int64_t n, compute_type_t<T> inv_scale) {
  using C = compute_type_t<T>;
  bool found = false;
#pragma omp parallel for reduction(|| : found) schedule(static) if (n >= kParallelGrain)
  for (int64_t i = 0; i < n; ++i) {
    C x = convert<C>(g[i]);
    if (!std::isfinite(x)) found = true;
    g[i] = convert<T>(x * inv_scale);
  }
  return found;
}

bool unscale_tensor(const Tensor& grad, double inv_scale) {
#if PRECIS_WITH_CUDA
  if (grad.is_cuda()) return cuda::unscale_and_check(grad, inv_scale);
#endif
  PRECIS_CHECK(grad.is_cpu() && grad.is_contiguous(), "GradScaler: gradients must be dense tensors (got ",
               describe(grad), ")");
  PRECIS_CHECK(is_floating(grad.dtype()), "GradScaler: gradients must be floating point, got ", describe(grad));
  return dispatch_all(grad.dtype(), "GradScaler", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (std::is_floating_point_v<T> || is_half_type<T>) {
      using C = compute_type_t<T>;
      return unscale_and_check_inf<T>(grad.data<T>(), grad.numel(), static_cast<C>(inv_scale));
    } else {
      return false;
    }
  });
}

}  // namespace

bool GradScaler::unscale_and_check(nn::FlatParameters& flat) const {
  if (!options_.enabled) return false;
  PRECIS_CHECK(!on_device(), "GradScaler: the state lives on the device; use unscale_on_device");
  bool found = false;
  for (const nn::FlatBuffer& b : flat.buffers())
    if (unscale_tensor(b.grad, 1.0 / scale_)) found = true;
  return found;
}

bool GradScaler::unscale_and_check(const std::vector<Tensor>& gradients) const {
  if (!options_.enabled) return false;
  PRECIS_CHECK(!on_device(), "GradScaler: the state lives on the device; use unscale_on_device");
  bool found = false;
  for (const Tensor& g : gradients)
    if (g.defined() && unscale_tensor(g, 1.0 / scale_)) found = true;
  return found;
}

void GradScaler::update(bool found_inf) {
  if (!options_.enabled) return;
  PRECIS_CHECK(!on_device(), "GradScaler: the state lives on the device; use update_on_device");
  if (found_inf) ++skipped_steps_;
  if (options_.mode == ScalerMode::fixed) return;
  if (found_inf) {
    growth_tracker_ = 0;
    if (++consecutive_overflows_ >= options_.hysteresis)
      scale_ = std::max(scale_ * options_.backoff_factor, options_.min_scale);
  } else {
    consecutive_overflows_ = 0;
    if (++growth_tracker_ == options_.growth_interval) {
      scale_ = std::min(scale_ * options_.growth_factor, options_.max_scale);
      growth_tracker_ = 0;
    }
  }
}

void GradScaler::keep_on_device(Device device) {
  if (!options_.enabled) return;
  PRECIS_CHECK(device.is_cuda(), "GradScaler::keep_on_device: the state moves to a GPU, got ", device);
#if PRECIS_WITH_CUDA
  device_state_ = empty({cuda::kScalerSlots}, DType::f64, device);
  device_scale_f32_ = empty({}, DType::f32, device);
  write_device_state();
#else
  PRECIS_FAIL("GradScaler::keep_on_device: this build of Precis has no CUDA backend");
#endif
}

void GradScaler::write_device_state() {
#if PRECIS_WITH_CUDA
  if (!on_device()) return;
  std::vector<double> s(cuda::kScalerSlots, 0.0);
  s[cuda::kScale] = scale_;
  s[cuda::kGrowthTracker] = static_cast<double>(growth_tracker_);
  s[cuda::kConsecutiveOverflows] = static_cast<double>(consecutive_overflows_);
  s[cuda::kSkippedSteps] = static_cast<double>(skipped_steps_);
  copy_(device_state_, from_vector(s, {cuda::kScalerSlots}));
  fill_(device_scale_f32_, static_cast<double>(static_cast<float>(scale_)));
#endif
}

const GradScaler& GradScaler::host() const {
#if PRECIS_WITH_CUDA
  if (on_device()) {
    std::vector<double> s = device_state_.to_vector<double>();
    scale_ = s[cuda::kScale];
    growth_tracker_ = static_cast<int64_t>(s[cuda::kGrowthTracker]);
    consecutive_overflows_ = static_cast<int64_t>(s[cuda::kConsecutiveOverflows]);
    skipped_steps_ = static_cast<int64_t>(s[cuda::kSkippedSteps]);
  }
#endif
  return *this;
}

void GradScaler::unscale_on_device(nn::FlatParameters& flat) const {
  std::vector<Tensor> gradients;
  for (const nn::FlatBuffer& b : flat.buffers()) gradients.push_back(b.grad);
  unscale_on_device(gradients);
}

void GradScaler::unscale_on_device(const std::vector<Tensor>& gradients) const {
  if (!options_.enabled) return;
  PRECIS_CHECK(on_device(), "GradScaler::unscale_on_device: call keep_on_device first");
#if PRECIS_WITH_CUDA
  fill_(found_inf(), 0.0);
  for (const Tensor& g : gradients)
    if (g.defined()) cuda::unscale_and_flag(g, device_state_);
#endif
}

Tensor GradScaler::found_inf() const {
#if PRECIS_WITH_CUDA
  if (on_device()) return device_state_.select(0, cuda::kFoundInf);
#endif
  return Tensor();
}

Tensor GradScaler::scale_on_device() const {
#if PRECIS_WITH_CUDA
  if (on_device()) return device_state_.select(0, cuda::kScale);
#endif
  return Tensor();
}

void GradScaler::update_on_device() {
  if (!options_.enabled) return;
  PRECIS_CHECK(on_device(), "GradScaler::update_on_device: call keep_on_device first");
#if PRECIS_WITH_CUDA
  cuda::update_on_device(device_state_, device_scale_f32_, options_);
#endif
}

double GradScaler::scale() const { return options_.enabled ? host().scale_ : 1.0; }
int64_t GradScaler::skipped_steps() const { return host().skipped_steps_; }
int64_t GradScaler::growth_tracker() const { return host().growth_tracker_; }
int64_t GradScaler::consecutive_overflows() const { return host().consecutive_overflows_; }

Json GradScaler::state() const {
  host();
  Json state = Json::object();
  state["mode"] = scaler_mode_name(options_.mode);
  state["scale"] = scale_;
  state["growth_tracker"] = growth_tracker_;
  state["consecutive_overflows"] = consecutive_overflows_;
  state["skipped_steps"] = skipped_steps_;
  return state;
}

void GradScaler::load_state(const Json& state) {
  PRECIS_CHECK(state.is_object(), "GradScaler state: expected a JSON object, got ", json_type_name(state.type()));
  for (const char* key : {"mode", "scale", "growth_tracker", "consecutive_overflows", "skipped_steps"})
    PRECIS_CHECK(state.contains(key), "GradScaler state: missing '", key, "'; is this a GradScaler state?");
  ScalerMode mode = parse_scaler_mode(state.at("mode").as_string());
  PRECIS_CHECK(mode == options_.mode, "GradScaler state: saved by a ", scaler_mode_name(mode),
               " scaler, but this one is ", scaler_mode_name(options_.mode), "; use the same loss scaling to resume");
  double scale = state.at("scale").as_double();
  int64_t growth = state.at("growth_tracker").as_int();
  int64_t overflows = state.at("consecutive_overflows").as_int();
  int64_t skipped = state.at("skipped_steps").as_int();
  PRECIS_CHECK(std::isfinite(scale) && scale > 0, "GradScaler state: scale must be a finite number > 0, got ", scale);
  PRECIS_CHECK(growth >= 0 && overflows >= 0 && skipped >= 0, "GradScaler state: counters must be >= 0, got "
               "growth_tracker ", growth, ", consecutive_overflows ", overflows, ", skipped_steps ", skipped);
  scale_ = scale;
  growth_tracker_ = growth;
  consecutive_overflows_ = overflows;
  skipped_steps_ = skipped;
  write_device_state();
}

}  // namespace precis::amp
