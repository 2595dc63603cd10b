// GPU tests skip, with the reason, where no GPU is usable, and Hopper tests where the GPU is no
// compute-capability 9.0 one (GTEST_SKIP must run in the test body itself, hence macros).
#pragma once

#include <gtest/gtest.h>

#include "core/gpu.h"

#define PRECIS_SKIP_WITHOUT_GPU()                                                                  \
  do {                                                                                             \
    if (::precis::cuda_device_count() == 0) GTEST_SKIP() << "no GPU: " << ::precis::cuda_status(); \
  } while (0)

#define PRECIS_SKIP_WITHOUT_HOPPER()                                                                          \
  do {                                                                                                        \
    PRECIS_SKIP_WITHOUT_GPU();                                                                                \
    if (::precis::cuda_compute_capability(0) != 90)                                                           \
      GTEST_SKIP() << "not a compute-capability 9.0 GPU (sm_" << ::precis::cuda_compute_capability(0) << ")"; \
  } while (0)
