// GradScaler: loss scaling for f16 training (DESIGN.md section 6), as
// torch.amp.GradScaler, plus a floor, a ceiling and Megatron-style hysteresis.
//
// A step with a scaler:
//   scaler.scale(loss).backward();
//   bool found_inf = scaler.unscale_and_check(flat);   // grads /= scale, inf/NaN?
//   (clip gradients; with several ranks, OR found_inf over them)
//   if (!found_inf) optimizer.step();
//   scaler.update(found_inf);
//
// Dynamic mode: an overflow step is skipped; after `hysteresis` consecutive
// overflow steps (and on every further one until a clean step) the scale
// backs off: scale = max(scale * backoff_factor, min_scale). Every
// `growth_interval` consecutive clean steps it grows: scale =
// min(scale * growth_factor, max_scale). Fixed mode keeps init_scale forever
// and still skips overflow steps. Disabled: scale() is the identity,
// unscale_and_check neither scales nor checks, update does nothing.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/json.h"
#include "core/tensor.h"
#include "nn/flat_parameters.h"

namespace precis::amp {

enum class ScalerMode { dynamic, fixed };

const char* scaler_mode_name(ScalerMode mode);  // "dynamic" | "fixed"
// "dynamic", "fixed" or "static" (the precision config's name for fixed).
ScalerMode parse_scaler_mode(const std::string& name);

struct GradScalerOptions {
  ScalerMode mode = ScalerMode::dynamic;
  double init_scale = 65536.0;  // 2^16
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;
  double min_scale = 1.0;          // floor of the backoff
  double max_scale = 16777216.0;   // 2^24, ceiling of the growth
  int64_t hysteresis = 1;          // consecutive overflow steps before a backoff (1: every one, as PyTorch)
  bool enabled = true;
};

class GradScaler {
 public:
  // Validates the options (precis::Error naming the bad one).
  explicit GradScaler(GradScalerOptions options = {});

  // loss * scale, differentiable; f16/bf16 losses are widened to f32 first so the
  // product cannot overflow. The loss itself when disabled.
  Tensor scale(const Tensor& loss) const;

  // One pass per gradient buffer: g *= 1/scale, and whether any g was inf or NaN
  // (checked before scaling). 1/scale is rounded to f32 for f32/f16/bf16 gradients
  // (f16/bf16 multiply in f32), kept in f64 for f64 ones.
  bool unscale_and_check(nn::FlatParameters& flat) const;
  bool unscale_and_check(const std::vector<Tensor>& gradients) const;

  // Advances the state machine after a step; found_inf says the step overflowed (and was skipped).
  void update(bool found_inf);

  double scale() const { return options_.enabled ? scale_ : 1.0; }
  int64_t skipped_steps() const { return skipped_steps_; }
  int64_t growth_tracker() const { return growth_tracker_; }
  int64_t consecutive_overflows() const { return consecutive_overflows_; }
  bool enabled() const { return options_.enabled; }
  const GradScalerOptions& options() const { return options_; }

  // {"mode", "scale", "growth_tracker", "consecutive_overflows", "skipped_steps"}; loading
  // restores it exactly and errors on a missing key, a bad value or another mode.
  Json state() const;
  void load_state(const Json& state);

 private:
  GradScalerOptions options_;
  double scale_;
  int64_t growth_tracker_ = 0;
  int64_t consecutive_overflows_ = 0;
  int64_t skipped_steps_ = 0;
};

}  // namespace precis::amp
