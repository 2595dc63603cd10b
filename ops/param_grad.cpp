#include "ops/param_grad.h"

#include "core/copy.h"

namespace precis::ops {

Tensor ParamGrad::returned_as(DType dtype) const {
  const Tensor r = returned();
  return r.defined() ? converted(r, dtype) : r;
}

ParamGrad param_grad(const BackwardArgs& g, size_t input, std::initializer_list<DType> grad_dtypes, const Shape& shape,
                     DType dtype, Device device) {
  if (!g.needs(input)) return {};
  if (device.is_cuda()) {
    for (DType grad_dtype : grad_dtypes)
      if (GradDestination destination = g.take_grad_destination(input, grad_dtype))
        return {destination.grad, destination};
  }
  return {empty(shape, dtype, device), {}};
}

}  // namespace precis::ops
