// Copies between host and device, fill and accumulate on the GPU.
//
// copy_: a contiguous same-dtype copy is one cudaMemcpy. Anything else (a
// strided or dtype-converting copy that crosses devices) is staged through a
// dense host or device buffer so that only dense bytes cross the bus.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstring>

#include "core/copy.h"
#include "core/cuda/cuda_check.h"

namespace precis::cuda {

namespace {

template <typename T>
__global__ void fill_kernel(T* out, int64_t n, T value) {
  int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = value;
}

// out[i] += in[i], both of type T, accumulated in float (or double for double).
template <typename T, typename Acc>
__global__ void accumulate_kernel(T* out, const T* in, int64_t n) {
  int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = static_cast<T>(static_cast<Acc>(out[i]) + static_cast<Acc>(in[i]));
}

constexpr int kThreads = 256;
unsigned blocks_for(int64_t n) { return static_cast<unsigned>((n + kThreads - 1) / kThreads); }

}  // namespace

void copy_(const Tensor& dst, const Tensor& src) {
  if (dst.numel() == 0) return;
  bool dense = dst.is_contiguous() && src.is_contiguous() && dst.dtype() == src.dtype();
  if (dense) {
    cudaMemcpyKind kind = src.is_cpu() ? cudaMemcpyHostToDevice
                          : dst.is_cpu() ? cudaMemcpyDeviceToHost
                                         : cudaMemcpyDeviceToDevice;
    PRECIS_CUDA_CHECK(cudaMemcpy(dst.raw_data(), src.raw_data(), dst.nbytes(), kind), "copy");
    return;
  }
  // Stage through the host: make the source dense on its side, convert on the host.
  PRECIS_CHECK(src.is_cpu() || dst.is_cpu() || src.dtype() == dst.dtype(),
               "copy: converting or strided copies between two GPUs are not supported yet (", describe(src), " to ",
               describe(dst), ")");
  Tensor host_src = empty(src.shape(), src.dtype());
  if (src.is_cpu()) {
    precis::copy_(host_src, src);
  } else {
    PRECIS_CHECK(src.is_contiguous(), "copy: strided reads from the GPU are not supported yet (", describe(src), ")");
    PRECIS_CUDA_CHECK(cudaMemcpy(host_src.raw_data(), src.raw_data(), src.nbytes(), cudaMemcpyDeviceToHost), "copy");
  }
  Tensor host_dst = empty(dst.shape(), dst.dtype());
  precis::copy_(host_dst, host_src);
  if (dst.is_cpu()) {
    precis::copy_(dst, host_dst);
  } else {
    PRECIS_CHECK(dst.is_contiguous(), "copy: strided writes to the GPU are not supported yet (", describe(dst), ")");
    PRECIS_CUDA_CHECK(cudaMemcpy(dst.raw_data(), host_dst.raw_data(), dst.nbytes(), cudaMemcpyHostToDevice), "copy");
  }
}

void fill_(const Tensor& dst, double value) {
  PRECIS_CHECK(dst.is_contiguous(), "fill: strided GPU tensors are not supported yet (", describe(dst), ")");
  int64_t n = dst.numel();
  if (n == 0) return;
  dispatch_all(dst.dtype(), "fill", [&](auto tag) {
    using T = typename decltype(tag)::type;
    // Eigen's half/bfloat16 share the 16-bit layout of CUDA's; fill with the raw bits.
    if constexpr (sizeof(T) == 2 && !std::is_integral_v<T>) {
      T host = T(static_cast<float>(value));
      uint16_t bits;
      std::memcpy(&bits, &host, 2);
      fill_kernel<<<blocks_for(n), kThreads>>>(static_cast<uint16_t*>(dst.raw_data()), n, bits);
    } else {
      fill_kernel<<<blocks_for(n), kThreads>>>(static_cast<T*>(dst.raw_data()), n, static_cast<T>(value));
    }
  });
  PRECIS_CUDA_CHECK(cudaGetLastError(), "fill");
}

void accumulate_(const Tensor& dst, const Tensor& src) {
  PRECIS_CHECK(dst.is_contiguous() && src.is_contiguous() && src.dtype() == dst.dtype() && src.device() == dst.device(),
               "accumulate: on the GPU both gradients must be dense, of one dtype and on one device (got ",
               describe(dst), " and ", describe(src), ")");
  int64_t n = dst.numel();
  if (n == 0) return;
  switch (dst.dtype()) {
    case DType::f32:
      accumulate_kernel<float, float><<<blocks_for(n), kThreads>>>(static_cast<float*>(dst.raw_data()),
                                                                   static_cast<const float*>(src.raw_data()), n);
      break;
    case DType::f64:
      accumulate_kernel<double, double><<<blocks_for(n), kThreads>>>(static_cast<double*>(dst.raw_data()),
                                                                     static_cast<const double*>(src.raw_data()), n);
      break;
    case DType::f16:
      accumulate_kernel<__half, float><<<blocks_for(n), kThreads>>>(static_cast<__half*>(dst.raw_data()),
                                                                    static_cast<const __half*>(src.raw_data()), n);
      break;
    case DType::bf16:
      accumulate_kernel<__nv_bfloat16, float><<<blocks_for(n), kThreads>>>(
          static_cast<__nv_bfloat16*>(dst.raw_data()), static_cast<const __nv_bfloat16*>(src.raw_data()), n);
      break;
    default:
      PRECIS_FAIL("accumulate: gradients must be floating, got ", describe(dst));
  }
  PRECIS_CUDA_CHECK(cudaGetLastError(), "accumulate");
}

}  // namespace precis::cuda
