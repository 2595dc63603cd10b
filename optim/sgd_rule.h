// SGD's per-element update, written once for the CPU loop (optim/sgd.cpp) and the CUDA
// kernel (optim/cuda/sgd.cu), in the compute type T (f32, f64 for f64 parameters):
//   d = g + wd x;  buf = first ? d : momentum buf + (1 - dampening) d   (with momentum)
//   d = nesterov ? d + momentum buf : buf;  x <- x - lr d
#pragma once

#include "core/philox.h"  // PRECIS_HOST_DEVICE

namespace precis::optim {

struct SGDRule {
  double momentum = 0, dampening = 0;
  bool nesterov = false;
};

// Returns the new x; `buf` (the momentum buffer's element, or null without momentum) is updated.
template <typename T>
PRECIS_HOST_DEVICE inline T sgd_element(T x, T grad, T* buf, double lr, double wd, const SGDRule& r, bool first) {
  T d = grad + static_cast<T>(wd) * x;
  if (buf) {
    *buf = first ? d : static_cast<T>(r.momentum) * *buf + static_cast<T>(1 - r.dampening) * d;
    d = r.nesterov ? d + static_cast<T>(r.momentum) * *buf : *buf;
  }
  return x - static_cast<T>(lr) * d;
}

}  // namespace precis::optim
