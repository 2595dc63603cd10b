// Activation observer: while one is set (the numerics report sets it for the
// steps it reports on), models pass each layer's output through it by name.
// The observer returns the tensor to continue with (e.g. an ops::tap of it).
#pragma once

#include <functional>
#include <string>

#include "core/tensor.h"

namespace precis::nn {

using ActivationObserver = std::function<Tensor(const std::string& name, const Tensor& x)>;

// Sets the observer for this thread (an empty function clears it).
void set_activation_observer(ActivationObserver observer);
bool observing();
// x itself when no observer is set.
Tensor observe(const std::string& name, const Tensor& x);

}  // namespace precis::nn
