// Argument checks shared by the ops. Each error names the op and the tensors.
#pragma once

#include <initializer_list>

#include "core/tensor.h"

namespace precis::ops {

// Every defined tensor is on one device; returns it.
Device common_device(const char* op, std::initializer_list<const Tensor*> tensors);
// The op has only a CPU kernel so far: a CUDA tensor is an error that says so.
void require_cpu(const char* op, std::initializer_list<const Tensor*> tensors);
void require_floating(const char* op, const Tensor& t, const char* what = "input");
void require_defined(const char* op, const Tensor& t, const char* what = "input");

}  // namespace precis::ops
