// The GPU half of the numerics report (plain C++ declarations): TensorNumerics' counters
// of a device tensor computed on its device in one kernel pass, queued on the compute
// stream; only the counters come back, with one synchronous copy of a small buffer.
// The results equal the CPU loop's (amp/numerics.cpp) on the same values.
#pragma once

#include "amp/numerics.h"
#include "core/tensor.h"

namespace precis::amp::cuda {

// TensorNumerics::add_values for a floating tensor (f32, f64, f16, bf16) on a GPU, any strides.
void add_values(const Tensor& t, TensorNumerics& stats);
// TensorNumerics::add_update for `before` and `after` of one dtype and shape and `grad` of that
// shape (any floating dtype), on one GPU, any strides.
void add_update(const Tensor& before, const Tensor& after, const Tensor& grad, TensorNumerics& stats);

}  // namespace precis::amp::cuda
