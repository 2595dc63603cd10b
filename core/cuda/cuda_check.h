// PRECIS_CUDA_CHECK(call, op): every CUDA runtime call is checked, and its error
// names the op that made it.
#pragma once

#include <cuda_runtime.h>

#include "core/error.h"

#define PRECIS_CUDA_CHECK(call, op)                                                                                \
  do {                                                                                                             \
    cudaError_t precis_status_ = (call);                                                                           \
    if (precis_status_ != cudaSuccess)                                                                             \
      PRECIS_FAIL(op, ": CUDA error ", cudaGetErrorName(precis_status_), " (", cudaGetErrorString(precis_status_), \
                  ") in ", #call);                                                                                 \
  } while (0)
