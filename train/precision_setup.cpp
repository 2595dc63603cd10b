#include "train/precision_setup.h"

namespace precis::train {

amp::PrecisionPolicy policy_from_config(const PrecisionConfig& c) {
  amp::PrecisionPolicy p = amp::PrecisionPolicy::parse(c.policy);
  bool refined = false;
  auto set_dtype = [&](const std::string& text, DType& field) {
    if (text.empty()) return;
    field = parse_dtype(text);
    refined = true;
  };
  set_dtype(c.params, p.param_dtype);
  set_dtype(c.compute, p.compute_dtype);
  set_dtype(c.output, p.output_dtype);
  if (!c.params.empty()) {
    p.grad_reduce_dtype = p.param_dtype;
    p.master_weights = p.param_dtype == DType::f16 || p.param_dtype == DType::bf16;
  }
  if (!c.master_weights.empty()) {
    p.master_weights = c.master_weights == "true";
    refined = true;
  }
  if (!c.allow_tf32.empty()) {
    p.allow_tf32 = c.allow_tf32 == "true";
    refined = true;
  }
  if (!c.loss_scaling.empty()) {
    p.loss_scaling = c.loss_scaling == "dynamic"  ? amp::LossScaling::dynamic
                     : c.loss_scaling == "static" ? amp::LossScaling::fixed
                                                  : amp::LossScaling::none;
    refined = true;
  }
  p.static_scale = c.loss_scale;
  if (refined) p.name += "*";  // a preset changed by explicit fields
  return p;
}

amp::GradScalerOptions scaler_options_from_config(const PrecisionConfig& c, const amp::PrecisionPolicy& policy) {
  amp::GradScalerOptions o;
  o.enabled = policy.loss_scaling != amp::LossScaling::none;
  o.mode = policy.loss_scaling == amp::LossScaling::fixed ? amp::ScalerMode::fixed : amp::ScalerMode::dynamic;
  o.init_scale = c.loss_scale;
  o.growth_factor = c.growth_factor;
  o.backoff_factor = c.backoff_factor;
  o.growth_interval = c.growth_interval;
  o.min_scale = c.min_scale;
  o.max_scale = c.max_scale;
  o.hysteresis = c.hysteresis;
  return o;
}

}  // namespace precis::train
