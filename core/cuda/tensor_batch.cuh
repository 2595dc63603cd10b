// Batched launches: one launch works on up to N tensors, whose table (pointers, sizes, and
// first_block, the first block of each tensor) is a kernel argument. Fewer, larger launches
// for the many small tensors of a model's parameters.
#pragma once

#include <cstdint>

namespace precis::cuda {

// A launch's table: up to N slots (one tensor's pointers and sizes each), count in use, and
// first_block[s], the first block of slot s (first_block[count] = the launch's blocks).
// Passed by value as a kernel argument (`const __grid_constant__`); at most ~32 KB.
template <typename Slot, int N>
struct TensorBatch {
  Slot slot[N];
  int64_t first_block[N + 1];
  int count;
};

// The tensor block `block` works on: s with first_block[s] <= block < first_block[s + 1]
// (first_block ascending, first_block[0] = 0), by binary search over the count tensors.
__device__ __forceinline__ int tensor_of_block(const int64_t* first_block, int count, int64_t block) {
  int low = 0, high = count - 1;  // the answer is in [low, high]
  while (low < high) {
    const int mid = (low + high + 1) / 2;
    if (block >= first_block[mid]) {
      low = mid;
    } else {
      high = mid - 1;
    }
  }
  return low;
}

}  // namespace precis::cuda
