// PRECIS_CUBLAS_CHECK(call, context...): every cuBLASLt call is checked, and its
// error names the op and the problem (the context parts, streamed as by PRECIS_CHECK).
// Include only from */cuda/*.cu files.
#pragma once

#include <cublasLt.h>

#include "core/error.h"

#define PRECIS_CUBLAS_CHECK(call, ...)                                                                  \
  do {                                                                                                  \
    cublasStatus_t precis_cublas_status_ = (call);                                                      \
    if (precis_cublas_status_ != CUBLAS_STATUS_SUCCESS)                                                 \
      PRECIS_FAIL(__VA_ARGS__, ": cuBLASLt error ", cublasLtGetStatusName(precis_cublas_status_), " (", \
                  cublasLtGetStatusString(precis_cublas_status_), ") in ", #call);                      \
  } while (0)
