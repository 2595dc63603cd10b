// Column sums of a matrix on the GPU: linear's bias gradient, db = g summed over its
// rows (ops/cuda/column_sums.cu says how). A plain C++ declaration: every CUDA type
// stays in the .cu file.
#pragma once

#include "core/tensor.h"

namespace precis::ops::cuda {

// out[c] = sum over r of g[r, c] for a 2-D g: [rows, cols] on a CUDA device, f32, f16 or
// bf16. Rows with unit column stride are read in place at any row stride (the sum reads
// g, never writes it, so rows may even overlap); other layouts are copied dense first.
// Accumulated in f32 in an order fixed by the shape and the GPU (no atomics: the same
// result on every run), rounded once to out: contiguous [cols] on g's device, in g's dtype
// or f32 (a parameter's f32 .grad). With `accumulate` the sums are added to what out holds
// (in f32, then rounded once) instead of written over it. Runs on the device's compute
// stream and does not synchronise. rows == 0 gives zeros (or leaves out as it is).
void column_sums(const Tensor& out, const Tensor& g, bool accumulate = false);

}  // namespace precis::ops::cuda
