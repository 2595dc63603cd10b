// The gradient of a parameter that a GPU kernel writes in a backward function: straight into
// the parameter's .grad where the engine offers it (core/autograd.h, take_grad_destination;
// the kernel then writes or adds there and the backward returns nothing for it), else into a
// new tensor that the backward returns.
#pragma once

#include <initializer_list>

#include "core/autograd.h"
#include "core/tensor.h"

namespace precis::ops {

struct ParamGrad {
  Tensor values;  // where the kernel writes; undefined where input's gradient is not needed
  GradDestination destination;

  // What the backward returns for the parameter: none where the gradient went into .grad.
  Tensor returned() const { return destination ? Tensor() : values; }
  // The same in `dtype` (the parameter's).
  Tensor returned_as(DType dtype) const;
};

// For input `input` of the node: on a GPU its .grad when the engine offers it in one of
// `grad_dtypes` (those the kernel writes: its f32 sums, say, and the parameter's 16-bit dtype,
// rounded once, for a 16-bit .grad: precision.grad_dtype), else a new tensor of `shape` and
// `dtype` on `device`; none when not needed.
ParamGrad param_grad(const BackwardArgs& g, size_t input, std::initializer_list<DType> grad_dtypes, const Shape& shape,
                     DType dtype, Device device);

}  // namespace precis::ops
