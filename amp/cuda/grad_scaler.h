// The GPU half of GradScaler (plain C++ declarations): the unscale-and-check pass,
// and the device-resident state of the sync-free step (GradScaler::keep_on_device).
#pragma once

#include "amp/grad_scaler.h"
#include "core/tensor.h"

namespace precis::amp::cuda {

// g[i] *= inv_scale over a dense floating gradient on the GPU; returns whether any
// element was inf or NaN before scaling (one 4-byte copy back, one sync).
bool unscale_and_check(const Tensor& grad, double inv_scale);

// The device-resident state: one f64 tensor [kScalerSlots] (the counters are whole
// numbers, exact in f64), read back only when the host asks for it.
enum ScalerSlot : int64_t { kScale, kGrowthTracker, kConsecutiveOverflows, kSkippedSteps, kFoundInf, kScalerSlots };

// g[i] *= inv_scale with inv_scale = 1 / state[kScale] computed on the device (rounded as
// unscale_and_check's); sets state[kFoundInf] to 1 when any element was inf or NaN. No copy
// back, no sync: capturable into a CUDA graph.
void unscale_and_flag(const Tensor& grad, const Tensor& state);
// GradScaler::update on the device, one thread: reads state[kFoundInf], advances the
// counters and the scale exactly as the host does (f64), and writes the new scale rounded
// to f32 into scale_f32 (the factor the loss is multiplied by).
void update_on_device(const Tensor& state, const Tensor& scale_f32, const GradScalerOptions& options);

}  // namespace precis::amp::cuda
