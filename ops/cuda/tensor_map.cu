// Tensor maps through the driver's cuTensorMapEncodeTiled (ops/cuda/tensor_map.h).
#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled
#include <cuda_runtime.h>

#include "ops/cuda/tensor_map.h"

namespace precis::ops::cuda {

namespace {

// The driver's cuTensorMapEncodeTiled (its CUDA 12.0 signature), or null where the driver
// has none; looked up once per process.
PFN_cuTensorMapEncodeTiled_v12000 encode_tiled_function() {
  static const PFN_cuTensorMapEncodeTiled_v12000 function = [] {
    void* entry = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &entry, 12000, cudaEnableDefault, &found) !=
            cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      cudaGetLastError();  // not an error of the caller's next launch
      return static_cast<PFN_cuTensorMapEncodeTiled_v12000>(nullptr);
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(entry);
  }();
  return function;
}

}  // namespace

bool encode_tiled_tensor_map(CUtensorMap& map, CUtensorMapDataType type, const void* base, int rank,
                             const uint64_t* sizes, const uint64_t* byte_strides, const uint32_t* box,
                             CUtensorMapSwizzle swizzle) {
  if (rank < 1 || rank > 5) return false;
  const PFN_cuTensorMapEncodeTiled_v12000 encode = encode_tiled_function();
  if (encode == nullptr) return false;
  cuuint64_t dims[5], strides[4];
  cuuint32_t boxes[5], element_strides[5];
  for (int i = 0; i < rank; ++i) {
    if (sizes[i] == 0) return false;
    dims[i] = sizes[i];
    boxes[i] = box[i];
    element_strides[i] = 1;
    if (i > 0) strides[i - 1] = byte_strides[i - 1];
  }
  return encode(&map, type, static_cast<cuuint32_t>(rank), const_cast<void*>(base), dims, strides, boxes,
                element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

}  // namespace precis::ops::cuda
