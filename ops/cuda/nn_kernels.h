// Kept only for ops/cuda/adamw.cu and ops/cuda/global_norm.cu, which a parallel change is
// moving to optim/cuda/: they take the device toolkit (core/cuda/) from here. Once they
// include the core/cuda/ headers they use themselves (and say `using namespace precis::cuda;`),
// delete this file. Everything else includes its op family's launcher header
// (ops/cuda/softmax.h, layer_norm.h, cross_entropy.h, embedding.h) and the toolkit.
#pragma once

#include "core/tensor.h"

#if defined(__CUDACC__)

#include "core/cuda/block_reduce.cuh"
#include "core/cuda/convert.cuh"
#include "core/cuda/dispatch.cuh"
#include "core/cuda/launch.cuh"
#include "core/cuda/pack.cuh"
#include "core/cuda/tensor_batch.cuh"

namespace precis::ops::cuda {
using namespace precis::cuda;
}  // namespace precis::ops::cuda

#endif  // __CUDACC__
