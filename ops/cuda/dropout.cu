// Dropout with Philox4x32-10 numbers, the CPU's stream word for word:
//   keep_i = uniform(philox_word(seed, offset, i)) >= p,   out_i = keep_i ? x_i * scale : 0
// One Philox call gives the words of four consecutive elements, so each thread of the
// forward kernel owns one block of four. The product is rounded once, in the compute type
// (f32 for halves), exactly as on the CPU, so CPU and GPU outputs agree bit for bit.
#include "core/copy.h"
#include "core/cuda/convert.cuh"
#include "core/cuda/dispatch.cuh"
#include "core/cuda/launch.cuh"
#include "core/cuda/strided_index.cuh"
#include "core/philox.h"
#include "ops/cuda/dropout.h"

namespace precis::ops::cuda {

using namespace precis::cuda;  // the device toolkit (core/cuda/)

namespace {

template <typename T>
__global__ void dropout_forward_kernel(T* out, bool* mask, const T* x, StridedIndex<1> index, int64_t n, double p,
                                       double scale, uint64_t seed, uint64_t offset) {
  precis::cuda::wait_for_previous_grid();
  precis::cuda::allow_next_grid_to_start();
  using C = compute_t<T>;
  const int64_t block = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (block * 4 >= n) return;
  const Philox4 words = philox4x32(offset + static_cast<uint64_t>(block), 0, seed);
  const C s = static_cast<C>(scale);
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const int64_t i = block * 4 + k;
    if (i >= n) break;
    const bool keep = static_cast<double>(uniform_from_bits(words.x[k])) >= p;
    int64_t off[1];
    index.offsets(i, off);
    mask[i] = keep;
    out[i] = keep ? convert_to<T>(convert_to<C>(x[off[0]]) * s) : convert_to<T>(C(0));
  }
}

template <typename T>
__global__ void apply_mask_kernel(T* out, const bool* mask, const T* t, StridedIndex<1> index, int64_t n,
                                  double scale) {
  precis::cuda::wait_for_previous_grid();
  precis::cuda::allow_next_grid_to_start();
  using C = compute_t<T>;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  int64_t off[1];
  index.offsets(i, off);
  out[i] = mask[i] ? convert_to<T>(convert_to<C>(t[off[0]]) * static_cast<C>(scale)) : convert_to<T>(C(0));
}

}  // namespace

std::pair<Tensor, Tensor> dropout(const Tensor& x_in, double p, double scale, uint64_t seed, uint64_t offset) {
  Tensor x = x_in;
  Tensor out = empty(x.shape(), x.dtype(), x.device());
  Tensor mask = empty(x.shape(), DType::boolean, x.device());
  const int64_t n = x.numel();
  if (n == 0) return {out, mask};
  const StridedIndex<1> index = index_over(x);
  cudaStream_t stream = stream_for(out);
  dispatch_floating(x.dtype(), "dropout", [&](auto tag) {
    using T = typename decltype(tag)::type;
    precis::cuda::launch(dropout_forward_kernel<T>, precis::cuda::grid_for(n, 4), precis::cuda::kBlockSize, 0, stream,
                         data_of<T>(out), data_of<bool>(mask), data_of<const T>(x), index, n, p, scale, seed, offset);
  });
  PRECIS_CUDA_CHECK_LAUNCH("dropout");
  return {out, mask};
}

Tensor apply_dropout_mask(const Tensor& t_in, const Tensor& mask_in, double scale) {
  PRECIS_CHECK(t_in.shape() == mask_in.shape(), "dropout: gradient of shape ", t_in.shape(), " for a mask of shape ",
               mask_in.shape());
  Tensor t = t_in;
  Tensor mask = dense(mask_in);
  Tensor out = empty(t.shape(), t.dtype(), t.device());
  const int64_t n = t.numel();
  if (n == 0) return out;
  const StridedIndex<1> index = index_over(t);
  cudaStream_t stream = stream_for(out);
  dispatch_floating(t.dtype(), "dropout", [&](auto tag) {
    using T = typename decltype(tag)::type;
    precis::cuda::launch(apply_mask_kernel<T>, precis::cuda::grid_for(n), precis::cuda::kBlockSize, 0, stream,
                         data_of<T>(out), data_of<const bool>(mask), data_of<const T>(t), index, n, scale);
  });
  PRECIS_CUDA_CHECK_LAUNCH("dropout");
  return out;
}

}  // namespace precis::ops::cuda
