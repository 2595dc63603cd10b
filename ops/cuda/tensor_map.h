// Tensor maps (CUtensorMap): the descriptors through which the copy engine of sm_90 (the
// TMA unit) copies boxes of a tensor between global and shared memory
// (cp.async.bulk.tensor, ops/cuda/bulk_copy.cuh). A map holds the tensor's base address,
// sizes and byte strides, the box shape, the shared-memory swizzle and what fills elements
// outside the tensor; it is built on the host by the driver's cuTensorMapEncodeTiled and
// passed to a kernel as a __grid_constant__ parameter.
//
// The driver function is looked up through the runtime (cudaGetDriverEntryPointByVersion),
// so the library does not link libcuda itself.
#pragma once

#include <cuda.h>

#include <cstdint>

namespace precis::ops::cuda {

// A tiled map of a tensor of `rank` dimensions (1 to 5, innermost first): sizes[i] elements
// along dimension i, byte_strides[i - 1] between consecutive indices of dimension i >= 1
// (dimension 0 is contiguous), boxes of box[i] elements (box[0] * element size a multiple of
// 16 bytes, at most 128 with 128-byte swizzle; every box[i] at most 256), elements outside
// the tensor read as zeros. Returns false, leaving `map` unspecified, where the copy engine
// cannot describe the tensor (base not 16-byte aligned, a stride not a multiple of 16 bytes,
// a size of 0, ...) or the driver has no cuTensorMapEncodeTiled.
bool encode_tiled_tensor_map(CUtensorMap& map, CUtensorMapDataType type, const void* base, int rank,
                             const uint64_t* sizes, const uint64_t* byte_strides, const uint32_t* box,
                             CUtensorMapSwizzle swizzle);

}  // namespace precis::ops::cuda
