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
//
// On a GPU the state can live on the device (keep_on_device), so that a step
// never waits for the host (and can be captured into a CUDA graph):
//   scaler.scale(loss).backward();          // loss * the scale read from device memory
//   scaler.unscale_on_device(flat);         // grads /= scale; found_inf() flag set on the device
//   (clip, optimizer step skipped on the device when found_inf() is set)
//   scaler.update_on_device();              // the state machine above, on the device
// The getters (scale(), skipped_steps(), state(), ...) then read the device state
// back (a copy and a sync each: ask at log time, not every step).
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

  // Moves the state to `device` (a GPU) for good; a no-op when disabled. From then on use
  // the *_on_device calls instead of unscale_and_check and update.
  void keep_on_device(Device device);
  bool on_device() const { return device_state_.defined(); }
  // g *= 1/scale for every gradient buffer, and found_inf() raised if any was inf or NaN
  // (cleared first). Nothing is read back.
  void unscale_on_device(nn::FlatParameters& flat) const;
  void unscale_on_device(const std::vector<Tensor>& gradients) const;
  // A device f64 scalar, nonzero when the last unscale_on_device met inf or NaN; undefined
  // unless on_device(). optim::clip_grad_norm_on_device sets it too, when it unscales.
  Tensor found_inf() const;
  // The scale as a device f64 scalar (a view of the state), undefined unless on_device().
  Tensor scale_on_device() const;
  // update(found_inf()) on the device.
  void update_on_device();

  double scale() const;
  int64_t skipped_steps() const;
  int64_t growth_tracker() const;
  int64_t consecutive_overflows() const;
  bool enabled() const { return options_.enabled; }
  const GradScalerOptions& options() const { return options_; }

  // {"mode", "scale", "growth_tracker", "consecutive_overflows", "skipped_steps"}; loading
  // restores it exactly and errors on a missing key, a bad value or another mode.
  Json state() const;
  void load_state(const Json& state);

 private:
  // The host fields, refreshed from the device first when the state lives there.
  const GradScaler& host() const;
  // Copies the host fields to the device state (when there is one).
  void write_device_state();

  GradScalerOptions options_;
  mutable double scale_;
  mutable int64_t growth_tracker_ = 0;
  mutable int64_t consecutive_overflows_ = 0;
  mutable int64_t skipped_steps_ = 0;
  // keep_on_device: {scale, growth_tracker, consecutive_overflows, skipped_steps, found_inf}
  // (f64 [5], amp/cuda/grad_scaler.h), and the scale as an f32 scalar for the loss product.
  Tensor device_state_, device_scale_f32_;
};

}  // namespace precis::amp
