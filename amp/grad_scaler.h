// GradScaler: loss scaling for f16 training (docs/architecture.md, "Precision policies"), as
// torch.amp.GradScaler, plus a floor, a ceiling and Megatron-style hysteresis.
//
// The state (scale, growth tracker, consecutive overflows, skipped steps, found_inf)
// is one f64 tensor on the parameters' device (amp/scaler_state.h), a CPU tensor on
// a CPU run, and every call is an op on it (a CPU loop or a CUDA kernel), so a GPU
// step never waits for the host and can be captured into a CUDA graph:
//   scaler.scale(loss).backward();   // loss * the scale read from the state
//   scaler.unscale_(grads);          // grads /= scale; found_inf() set when any was inf/NaN
//   (clip; with several ranks, OR found_inf() over them; the optimizer step skipped
//    when found_inf() is set: optimizer.step({.skip_if = scaler.found_inf()}))
//   scaler.update();                 // the state machine (amp/scaler_state.h)
// optim::clip_grad_norm can take the place of unscale_ (it reads scale_tensor() and
// sets found_inf(), and the optimizer applies 1/scale as it reads each gradient), so
// the trainer makes no pass over the gradients of its own to unscale them.
// Fixed mode keeps init_scale forever and still skips overflow steps. Disabled (no loss
// scaling: fp32, tf32, bf16): scale() is the identity, unscale_ does nothing and
// scale_tensor() is undefined, but found_inf() is still the flag clip_grad_norm sets and
// update() still counts the skipped steps, so a non-finite step is skipped and counted
// under every policy (train/nonfinite.h stops a run after too many).
// The getters (scale(), skipped_steps(), state(), ...) read the state back (on a
// GPU a copy and a sync each: ask at log time, not every step).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "amp/scaler_state.h"
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
  double min_scale = 1.0;         // floor of the backoff
  double max_scale = 16777216.0;  // 2^24, ceiling of the growth
  int64_t hysteresis = 1;         // consecutive overflow steps before a backoff (1: every one, as PyTorch)
  bool enabled = true;
};

class GradScaler {
 public:
  // Validates the options (precis::Error naming the bad one); the state lives on `device`.
  explicit GradScaler(GradScalerOptions options = {}, Device device = Device::cpu());

  // loss * scale, differentiable; f16/bf16 losses are widened to f32 first so the
  // product cannot overflow. The factor is the scale rounded to f32, read from memory
  // (a replayed CUDA graph sees the current one). The loss itself when disabled.
  Tensor scale(const Tensor& loss) const;

  // One pass per gradient: g *= 1/scale, and found_inf() set to 1 when any g was inf or
  // NaN (checked before scaling; cleared first). 1/scale is rounded to f32 for
  // f32/f16/bf16 gradients (f16/bf16 multiply in f32), kept in f64 for f64 ones.
  void unscale_(nn::FlatParameters& flat);
  void unscale_(const std::vector<Tensor>& gradients);

  // Advances the state machine after a step, with found_inf() saying it overflowed (when
  // disabled: counts the skipped steps only).
  void update();

  // Views of the state (f64 scalars on device()): nonzero when the step overflowed (unscale_
  // or optim::clip_grad_norm set it), and the scale (undefined when disabled: 1).
  Tensor found_inf() const;
  Tensor scale_tensor() const;
  Device device() const { return state_.device(); }

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
  // The state read back to the host (f64 [kScalerSlots]).
  std::vector<double> read_state() const;
  // Writes `slots` into the state and the f32 copy of the scale.
  void write_state(const std::vector<double>& slots);

  GradScalerOptions options_;
  // f64 [kScalerSlots] (amp/scaler_state.h), and the scale as an f32 scalar for the loss product.
  Tensor state_, scale_f32_;
};

}  // namespace precis::amp
