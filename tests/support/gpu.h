// GPU tests skip, with the reason, where no GPU is usable (GTEST_SKIP must run
// in the test body itself, hence a macro).
#pragma once

#include <gtest/gtest.h>

#include "core/gpu.h"

#define PRECIS_SKIP_WITHOUT_GPU()                                                                  \
  do {                                                                                             \
    if (::precis::cuda_device_count() == 0) GTEST_SKIP() << "no GPU: " << ::precis::cuda_status(); \
  } while (0)
