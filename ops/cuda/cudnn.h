// cuDNN for the ops that call it (conv2d): the per-device handle, made on first use and
// bound to the device's compute stream; checked calls; owned descriptors; the descriptor of
// a [N, C, H, W] tensor in either memory format. Include only from
// ops/cuda/*.cu files.
#pragma once

#include <cudnn.h>

#include "core/error.h"
#include "core/tensor.h"
#include "ops/conv.h"

// PRECIS_CUDNN_CHECK(call, context...): the error names the op and problem (the context
// parts, streamed as by PRECIS_CHECK) and cuDNN's status.
#define PRECIS_CUDNN_CHECK(call, ...)                                                                       \
  do {                                                                                                      \
    cudnnStatus_t precis_cudnn_status_ = (call);                                                            \
    if (precis_cudnn_status_ != CUDNN_STATUS_SUCCESS)                                                       \
      PRECIS_FAIL(__VA_ARGS__, ": cuDNN error ", cudnnGetErrorString(precis_cudnn_status_), " in ", #call); \
  } while (0)

namespace precis::ops::cuda::cudnn {

// The handle of `device`, set to run on its compute stream (created on first use: a machine
// without a driver never touches cuDNN).
cudnnHandle_t handle(Device device);

// cuDNN's name for an f32, f16 or bf16 tensor's dtype; an error naming `op` for others.
cudnnDataType_t data_type(DType dtype, const char* op);

// The alpha/beta scaling factors cuDNN reads: float for f32/f16/bf16 data (double for f64).
struct Scaling {
  float value;
  const void* get() const { return &value; }
};
inline constexpr Scaling kOne{1.0f}, kZero{0.0f};

// Owns a cuDNN descriptor, so an error thrown half-way leaks none.
template <typename Handle, cudnnStatus_t (*Create)(Handle*), cudnnStatus_t (*Destroy)(Handle)>
class Owned {
 public:
  Owned() { PRECIS_CUDNN_CHECK(Create(&handle_), "creating a cuDNN descriptor"); }
  ~Owned() { Destroy(handle_); }
  Owned(const Owned&) = delete;
  Owned& operator=(const Owned&) = delete;
  Handle get() const { return handle_; }

 private:
  Handle handle_ = nullptr;
};
using TensorDesc = Owned<cudnnTensorDescriptor_t, cudnnCreateTensorDescriptor, cudnnDestroyTensorDescriptor>;
using FilterDesc = Owned<cudnnFilterDescriptor_t, cudnnCreateFilterDescriptor, cudnnDestroyFilterDescriptor>;
using ConvolutionDesc =
    Owned<cudnnConvolutionDescriptor_t, cudnnCreateConvolutionDescriptor, cudnnDestroyConvolutionDescriptor>;

cudnnTensorFormat_t tensor_format(MemoryFormat format);

// Sets `desc` to the [n, c, h, w] tensor of `dtype` laid out dense in `format`.
void set_image(const TensorDesc& desc, int64_t n, int64_t c, int64_t h, int64_t w, MemoryFormat format, DType dtype,
               const char* op);

}  // namespace precis::ops::cuda::cudnn
