// The cuDNN handles and descriptors (ops/cuda/cudnn.h).
#include <map>
#include <mutex>

#include "core/cuda/runtime.h"
#include "ops/cuda/cudnn.h"

namespace precis::ops::cuda::cudnn {

cudnnHandle_t handle(Device device) {
  static std::mutex mutex;
  static std::map<int, cudnnHandle_t> handles;  // kept until the process ends
  cudnnHandle_t h;
  {
    std::lock_guard<std::mutex> lock(mutex);
    cudnnHandle_t& slot = handles[device.index];
    if (!slot) {
      precis::cuda::set_device(device);
      PRECIS_CUDNN_CHECK(cudnnCreate(&slot), "creating the cuDNN handle of ", device);
    }
    h = slot;
  }
  PRECIS_CUDNN_CHECK(cudnnSetStream(h, precis::cuda::compute_stream(device)), "binding cuDNN to the compute stream of ",
                     device);
  return h;
}

cudnnDataType_t data_type(DType dtype, const char* op) {
  switch (dtype) {
    case DType::f32:
      return CUDNN_DATA_FLOAT;
    case DType::f16:
      return CUDNN_DATA_HALF;
    case DType::bf16:
      return CUDNN_DATA_BFLOAT16;
    default:
      PRECIS_FAIL(op, ": the GPU path takes float32, float16 or bfloat16 tensors, got ", dtype_name(dtype));
  }
}

cudnnTensorFormat_t tensor_format(MemoryFormat format) {
  return format == MemoryFormat::channels_last ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW;
}

void set_image(const TensorDesc& desc, int64_t n, int64_t c, int64_t h, int64_t w, MemoryFormat format, DType dtype,
               const char* op) {
  PRECIS_CUDNN_CHECK(
      cudnnSetTensor4dDescriptor(desc.get(), tensor_format(format), data_type(dtype, op), static_cast<int>(n),
                                 static_cast<int>(c), static_cast<int>(h), static_cast<int>(w)),
      op, ": describing a [", n, ", ", c, ", ", h, ", ", w, "] ", dtype_name(dtype), " tensor");
}

}  // namespace precis::ops::cuda::cudnn
