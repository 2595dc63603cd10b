#include "amp/grad_scaler.h"

#if PRECIS_WITH_CUDA
#include "amp/cuda/grad_scaler.h"
#endif

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

GradScaler::GradScaler(GradScalerOptions options, Device device) : options_(options) {
  const GradScalerOptions& o = options_;
  PRECIS_CHECK(std::isfinite(o.init_scale) && o.init_scale > 0,
               "GradScaler: init_scale must be a finite number > 0, got ", o.init_scale);
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
  state_ = empty({kScalerSlots}, DType::f64, device);
  scale_f32_ = empty({}, DType::f32, device);
  std::vector<double> slots(kScalerSlots, 0.0);
  slots[kScale] = o.init_scale;
  write_state(slots);
}

Tensor GradScaler::scale(const Tensor& loss) const {
  if (!options_.enabled) return loss;
  bool narrow = loss.dtype() == DType::f16 || loss.dtype() == DType::bf16;
  const Tensor wide = narrow ? ops::cast(loss, DType::f32) : loss;
  return ops::mul(wide, scale_f32_);
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

// The unscale op: g *= 1 / state[kScale] (rounded to g's compute type), state[kFoundInf] = 1
// when any element was inf or NaN; a CUDA kernel for GPU gradients.
void unscale_gradient(const Tensor& grad, const Tensor& state) {
  PRECIS_CHECK(grad.device() == state.device(), "GradScaler: gradient on ", grad.device(),
               " but the scaler's state on ", state.device(), "; create the scaler on the parameters' device");
  // Dense in any order of its dims (a channels-last weight's): each element is scaled where it is.
  PRECIS_CHECK(is_non_overlapping_and_dense(grad), "GradScaler: gradients must be dense tensors (got ", describe(grad),
               ")");
  PRECIS_CHECK(is_floating(grad.dtype()), "GradScaler: gradients must be floating point, got ", describe(grad));
#if PRECIS_WITH_CUDA
  if (grad.is_cuda()) return cuda::unscale_(grad, state);
#endif
  double* s = state.data<double>();
  const bool found = dispatch_all(grad.dtype(), "GradScaler", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (std::is_floating_point_v<T> || is_half_type<T>) {
      using C = compute_type_t<T>;
      return unscale_and_check_inf<T>(grad.data<T>(), grad.numel(), static_cast<C>(1.0 / s[kScale]));
    } else {
      return false;
    }
  });
  if (found) s[kFoundInf] = 1;
}

ScalerRule rule_of(const GradScalerOptions& o) {
  return {o.enabled && o.mode == ScalerMode::dynamic,
          o.growth_factor,
          o.backoff_factor,
          o.min_scale,
          o.max_scale,
          static_cast<double>(o.growth_interval),
          static_cast<double>(o.hysteresis)};
}

}  // namespace

void GradScaler::unscale_(nn::FlatParameters& flat) {
  std::vector<Tensor> gradients;
  for (const nn::FlatBuffer& b : flat.buffers()) gradients.push_back(b.grad);
  unscale_(gradients);
}

void GradScaler::unscale_(const std::vector<Tensor>& gradients) {
  if (!options_.enabled) return;
  fill_(found_inf(), 0.0);
  for (const Tensor& g : gradients)
    if (g.defined() && g.numel() > 0) unscale_gradient(g, state_);
}

void GradScaler::update() {
#if PRECIS_WITH_CUDA
  if (state_.is_cuda()) return cuda::update_(state_, scale_f32_, rule_of(options_));
#endif
  advance_scaler_state(state_.data<double>(), rule_of(options_));
  scale_f32_.data<float>()[0] = static_cast<float>(state_.data<double>()[kScale]);
}

Tensor GradScaler::found_inf() const { return state_.select(0, kFoundInf); }

Tensor GradScaler::scale_tensor() const { return options_.enabled ? state_.select(0, kScale) : Tensor(); }

std::vector<double> GradScaler::read_state() const { return state_.to_vector<double>(); }

void GradScaler::write_state(const std::vector<double>& slots) {
  copy_(state_, from_vector(slots, {kScalerSlots}));
  fill_(scale_f32_, static_cast<double>(static_cast<float>(slots[kScale])));
}

double GradScaler::scale() const { return options_.enabled ? read_state()[kScale] : 1.0; }
int64_t GradScaler::skipped_steps() const { return static_cast<int64_t>(read_state()[kSkippedSteps]); }
int64_t GradScaler::growth_tracker() const { return static_cast<int64_t>(read_state()[kGrowthTracker]); }
int64_t GradScaler::consecutive_overflows() const { return static_cast<int64_t>(read_state()[kConsecutiveOverflows]); }

Json GradScaler::state() const {
  const std::vector<double> s = read_state();
  Json state = Json::object();
  state["mode"] = scaler_mode_name(options_.mode);
  state["scale"] = s[kScale];
  state["growth_tracker"] = static_cast<int64_t>(s[kGrowthTracker]);
  state["consecutive_overflows"] = static_cast<int64_t>(s[kConsecutiveOverflows]);
  state["skipped_steps"] = static_cast<int64_t>(s[kSkippedSteps]);
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
  PRECIS_CHECK(growth >= 0 && overflows >= 0 && skipped >= 0,
               "GradScaler state: counters must be >= 0, got "
               "growth_tracker ",
               growth, ", consecutive_overflows ", overflows, ", skipped_steps ", skipped);
  std::vector<double> slots(kScalerSlots, 0.0);
  slots[kScale] = scale;
  slots[kGrowthTracker] = static_cast<double>(growth);
  slots[kConsecutiveOverflows] = static_cast<double>(overflows);
  slots[kSkippedSteps] = static_cast<double>(skipped);
  write_state(slots);
}

}  // namespace precis::amp
