// What an index check on the GPU reports (embedding indices, cross-entropy targets).
#pragma once

#include <cstdint>

namespace precis::ops::cuda {

// The first out-of-range index a kernel met (by position in the flattened index
// tensor), found on the device and copied back once; position -1 when none.
struct BadIndex {
  int64_t position = -1;
  int64_t value = 0;
};

}  // namespace precis::ops::cuda
