// where, where_scalar (masked_fill and the selection gradients) and causal_mask.
//   where:        out[i] = cond[i] != 0 ? a[i] : b[i]       (all three broadcast to out's shape)
//   where_scalar: out[i] = (cond[i] != 0) == when ? x[i] : value
//   causal_mask:  out[i][j] = j > i
// The condition is read as bytes (bool and u8 are both one byte); the picked value is
// copied, not recomputed, so the results equal the CPU's bit for bit.
#include "core/copy.h"
#include "core/cuda/convert.cuh"
#include "core/cuda/dispatch.cuh"
#include "core/cuda/launch.cuh"
#include "core/cuda/strided_index.cuh"
#include "ops/broadcast.h"
#include "ops/cuda/elementwise.h"

namespace precis::ops::cuda {

using namespace precis::cuda;  // the device toolkit (core/cuda/)

namespace {

template <typename T>
__global__ void where_kernel(T* out, const uint8_t* cond, const T* a, const T* b, StridedIndex<3> index, int64_t n) {
  precis::cuda::wait_for_previous_grid();
  precis::cuda::allow_next_grid_to_start();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  int64_t off[3];
  index.offsets(i, off);
  out[i] = cond[off[0]] != 0 ? a[off[1]] : b[off[2]];
}

template <typename T>
__global__ void where_scalar_kernel(T* out, const uint8_t* cond, const T* x, StridedIndex<2> index, bool when,
                                    double value, int64_t n) {
  precis::cuda::wait_for_previous_grid();
  precis::cuda::allow_next_grid_to_start();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  int64_t off[2];
  index.offsets(i, off);
  out[i] = (cond[off[0]] != 0) == when ? x[off[1]] : convert_to<T>(value);
}

__global__ void causal_mask_kernel(bool* out, int64_t T) {
  precis::cuda::wait_for_previous_grid();
  precis::cuda::allow_next_grid_to_start();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= T * T) return;
  out[i] = i % T > i / T;
}

void check_condition(const char* op, const Tensor& cond) {
  PRECIS_CHECK(cond.dtype() == DType::boolean || cond.dtype() == DType::u8, op,
               ": the condition must be a bool or uint8 tensor, got ", describe(cond));
}

}  // namespace

Tensor where(const Tensor& cond_in, const Tensor& a_in, const Tensor& b_in, DType dtype) {
  check_condition("where", cond_in);
  Shape shape = broadcast_shapes(broadcast_shapes(cond_in.shape(), a_in.shape(), "where"), b_in.shape(), "where");
  std::array<Tensor, 3> operands{broadcast_view(cond_in, shape, "where"),
                                 broadcast_view(converted(a_in, dtype), shape, "where"),
                                 broadcast_view(converted(b_in, dtype), shape, "where")};
  Tensor out = empty(shape, dtype, a_in.device());
  const int64_t n = out.numel();
  if (n == 0) return out;
  StridedIndex<3> index = index_over<3>(shape, operands);
  cudaStream_t stream = stream_for(out);
  dispatch_floating(dtype, "where", [&](auto tag) {
    using T = typename decltype(tag)::type;
    precis::cuda::launch(where_kernel<T>, precis::cuda::grid_for(n), precis::cuda::kBlockSize, 0, stream,
                         data_of<T>(out), data_of<const uint8_t>(operands[0]), data_of<const T>(operands[1]),
                         data_of<const T>(operands[2]), index, n);
  });
  PRECIS_CUDA_CHECK_LAUNCH("where");
  return out;
}

Tensor where_scalar(const Tensor& cond_in, const Tensor& x_in, bool when, double value) {
  check_condition("where", cond_in);
  Shape shape = broadcast_shapes(cond_in.shape(), x_in.shape(), "where");
  std::array<Tensor, 2> operands{broadcast_view(cond_in, shape, "where"), broadcast_view(x_in, shape, "where")};
  Tensor out = empty(shape, x_in.dtype(), x_in.device());
  const int64_t n = out.numel();
  if (n == 0) return out;
  StridedIndex<2> index = index_over<2>(shape, operands);
  cudaStream_t stream = stream_for(out);
  dispatch_floating(x_in.dtype(), "where", [&](auto tag) {
    using T = typename decltype(tag)::type;
    precis::cuda::launch(where_scalar_kernel<T>, precis::cuda::grid_for(n), precis::cuda::kBlockSize, 0, stream,
                         data_of<T>(out), data_of<const uint8_t>(operands[0]), data_of<const T>(operands[1]), index,
                         when, value, n);
  });
  PRECIS_CUDA_CHECK_LAUNCH("where");
  return out;
}

Tensor causal_mask(int64_t T, Device device) {
  Tensor mask = empty({T, T}, DType::boolean, device);
  if (T == 0) return mask;
  precis::cuda::launch(causal_mask_kernel, precis::cuda::grid_for(T * T), precis::cuda::kBlockSize, 0, stream_for(mask),
                       data_of<bool>(mask), T);
  PRECIS_CUDA_CHECK_LAUNCH("causal_mask");
  return mask;
}

}  // namespace precis::ops::cuda
