// PRECIS_NCCL_CHECK(call, op): an NCCL call whose failure becomes a precis::Error
// naming the op, NCCL's error name and NCCL's last message (what failed inside it).
// Include only from files built with PRECIS_WITH_CUDA (it includes nccl.h).
#pragma once

#include <nccl.h>

#include "core/error.h"

#define PRECIS_NCCL_CHECK(call, op)                                                                              \
  do {                                                                                                           \
    ncclResult_t precis_nccl_status_ = (call);                                                                   \
    if (precis_nccl_status_ != ncclSuccess)                                                                      \
      PRECIS_FAIL(op, ": NCCL error ", ncclGetErrorString(precis_nccl_status_), " (", ncclGetLastError(nullptr), \
                  ") in ", #call);                                                                               \
  } while (0)
