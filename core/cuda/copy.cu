// copy_, fill_ and accumulate_ for GPU tensors, queued on the device's compute
// stream (core/copy.h says what they compute; the CPU versions are in core/copy.cpp).
//
// Each kernel comes in two forms:
//   - contiguous: both operands dense and aligned, in the same layout (row-major,
//     or any one permutation of dims such as channels-last), kVec elements per thread so
//     that the wider operand moves in 16-byte loads and stores;
//   - strided: any strides, up to 8 dims once dims that are contiguous in every
//     operand have been merged; each thread turns its row-major index into one
//     offset per operand with 32-bit index math (a multiply and a shift per
//     dim). Tensors of 2^31 elements or more are cut into launches below that.
// Both convert between any two dtypes the way the CPU does (core/convert.h):
// 16-bit floats through float, anything to bool as "not zero", so a GPU result
// equals the CPU's bit for bit.
//
// Copies between host and device use cudaMemcpyAsync on the compute stream; only
// dense bytes cross the bus. Host to device: a strided host source is first made
// dense on the host, the bytes land in the destination (or in a dense device
// buffer that the strided kernel then lays out and converts). The call returns
// at once: the driver stages pageable memory before returning, and a pinned
// source is kept from reuse until the copy has run (record_pinned_use). Device to
// host: the strided kernel makes a dense buffer in the destination dtype on the
// device, then one copy brings it over; the call waits for it unless the
// destination is a dense pinned tensor (core/pinned.h: synchronize() first).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "core/copy.h"
#include "core/cuda/dispatch.cuh"
#include "core/cuda/launch.cuh"
#include "core/cuda/pack.cuh"
#include "core/cuda/pinned_allocator.h"
#include "core/cuda/runtime.h"
#include "core/cuda/strided_index.cuh"
#include "core/cuda/wait_watch.h"

namespace precis::cuda {

namespace {

// Calls fn(TypeTag<T>{}) for the floating dtypes: accumulate_ sums gradients,
// which are always floating point, so the GPU builds only those 16 pairs.
template <typename Fn>
void dispatch_gradient(DType dtype, const char* op, Fn&& fn) {
  dispatch_device<float, double, __half, __nv_bfloat16>(
      dtype, std::forward<Fn>(fn), op,
      ": on the GPU both operands must be floating point (float32, float64, float16 or bfloat16), got ",
      dtype_name(dtype));
}

// dst + src in float, or in double when either is double. The CPU sums in
// double; rounding twice changes nothing when the wider format has more than
// twice the digits of the operands (float against f16/bf16, double against
// float), so the results agree, except maybe in the last bit of an f16 or bf16
// destination summing an f32 source.
template <typename D, typename S>
__device__ inline D accumulate_one(D out, S in) {
  using Acc = std::conditional_t<std::is_same_v<D, double> || std::is_same_v<S, double>, double, float>;
  return convert_to<D>(convert_to<Acc>(out) + convert_to<Acc>(in));
}

// Elements per thread in the contiguous kernels: 16 bytes of the wider operand.
template <typename D, typename S>
inline constexpr int kVecFor = static_cast<int>(16 / (sizeof(D) > sizeof(S) ? sizeof(D) : sizeof(S)));

// ---------------------------------------------------------------- strided launches

// Calls launch(offsets, base, n) for pieces of fewer than 2^31 elements that
// together cover `layout`; base holds each operand's offset of the piece's first element.
template <size_t N, typename Launch>
void launch_in_pieces(MergedDims<N> layout, std::array<int64_t, N> base, Launch& launch) {
  int64_t numel = 1;
  for (int64_t size : layout.sizes) numel *= size;
  if (numel <= INT32_MAX) {
    StridedOffsets<N> offsets;
    offsets.ndim = static_cast<int>(layout.sizes.size());
    for (size_t d = 0; d < layout.sizes.size(); ++d) {
      offsets.sizes[d] = FastDivider(static_cast<uint32_t>(layout.sizes[d]));
      for (size_t k = 0; k < N; ++k) offsets.strides[d][k] = layout.strides[d][k];
    }
    return launch(offsets, base, static_cast<uint32_t>(numel));
  }
  // Cut along the outermost dim: a few of its rows per piece, or one row at a
  // time, itself cut further, when a single row is too large.
  const int64_t outer = layout.sizes.back();
  const std::array<int64_t, N> outer_stride = layout.strides.back();
  const int64_t inner = numel / outer;
  MergedDims<N> piece = layout;
  if (inner > INT32_MAX) {
    piece.sizes.pop_back();
    piece.strides.pop_back();
  }
  const int64_t rows = inner > INT32_MAX ? 1 : INT32_MAX / inner;
  for (int64_t row = 0; row < outer; row += rows) {
    if (inner <= INT32_MAX) piece.sizes.back() = std::min(rows, outer - row);
    std::array<int64_t, N> at = base;
    for (size_t k = 0; k < N; ++k) at[k] += row * outer_stride[k];
    launch_in_pieces(piece, at, launch);
  }
}

// Merges dims (merge_dims), then launches in pieces (launch_in_pieces).
template <size_t N, typename Launch>
void launch_strided(const Shape& shape, const std::array<const Shape*, N>& strides, const char* op, Launch&& launch) {
  const MergedDims<N> layout = merge_dims<N>(shape, strides);
  PRECIS_CHECK(layout.sizes.size() <= kMaxDims, op, ": a GPU tensor of shape ", shape, " has ", layout.sizes.size(),
               " dims that cannot be merged; at most ", kMaxDims, " are supported (make it contiguous first)");
  launch_in_pieces(layout, std::array<int64_t, N>{}, launch);
}

// Blocks for a grid-stride loop over `work` items, one per thread (at least one
// block, at most 2^20: larger grids loop).
unsigned blocks_for(int64_t work) {
  return static_cast<unsigned>(std::clamp<int64_t>((work + kBlockSize - 1) / kBlockSize, 1, int64_t(1) << 20));
}

// ---------------------------------------------------------------- kernels

// copy, contiguous: out[i] = convert(in[i]) for i < n, as packs of kVec elements
// (the first n / kVec * kVec) and then single elements for the tail.
// Bytes moved: n * (sizeof(S) + sizeof(D)).
template <typename D, typename S, int kVec>
__global__ void copy_contiguous_kernel(D* __restrict__ out, const S* __restrict__ in, int64_t n) {
  precis::cuda::wait_for_previous_grid();
  precis::cuda::allow_next_grid_to_start();
  const int64_t packs = n / kVec;
  const int64_t first = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t p = first; p < packs; p += stride) {
    Pack<S, kVec> source = reinterpret_cast<const Pack<S, kVec>*>(in)[p];
    Pack<D, kVec> result;
#pragma unroll
    for (int k = 0; k < kVec; ++k) result.v[k] = convert_to<D>(source.v[k]);
    reinterpret_cast<Pack<D, kVec>*>(out)[p] = result;
  }
  const int64_t tail = packs * kVec + first;
  if (tail < n) out[tail] = convert_to<D>(in[tail]);
}

// copy, strided: out[o(i)] = convert(in[s(i)]) for the i-th element (row-major)
// of the shape, o and s being the offsets of the two operands (StridedOffsets).
// Bytes moved: n * (sizeof(S) + sizeof(D)), coalesced where the inner strides are 1.
template <typename D, typename S>
__global__ void copy_strided_kernel(D* out, const S* in, uint32_t n, StridedOffsets<2> offsets) {
  precis::cuda::wait_for_previous_grid();
  precis::cuda::allow_next_grid_to_start();
  for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    int64_t at[2];
    offsets.get(i, at);
    out[at[0]] = convert_to<D>(in[at[1]]);
  }
}

// accumulate, contiguous: out[i] = out[i] + in[i], in packs of kVec as copy_contiguous_kernel.
// Bytes moved: n * (2 * sizeof(D) + sizeof(S)).
template <typename D, typename S, int kVec>
__global__ void accumulate_contiguous_kernel(D* out, const S* in, int64_t n) {
  precis::cuda::wait_for_previous_grid();
  precis::cuda::allow_next_grid_to_start();
  const int64_t packs = n / kVec;
  const int64_t first = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t p = first; p < packs; p += stride) {
    Pack<S, kVec> source = reinterpret_cast<const Pack<S, kVec>*>(in)[p];
    Pack<D, kVec> result = reinterpret_cast<const Pack<D, kVec>*>(out)[p];
#pragma unroll
    for (int k = 0; k < kVec; ++k) result.v[k] = accumulate_one(result.v[k], source.v[k]);
    reinterpret_cast<Pack<D, kVec>*>(out)[p] = result;
  }
  const int64_t tail = packs * kVec + first;
  if (tail < n) out[tail] = accumulate_one(out[tail], in[tail]);
}

// accumulate, strided: out[o(i)] += in[s(i)].
// Bytes moved: n * (2 * sizeof(D) + sizeof(S)).
template <typename D, typename S>
__global__ void accumulate_strided_kernel(D* out, const S* in, uint32_t n, StridedOffsets<2> offsets) {
  precis::cuda::wait_for_previous_grid();
  precis::cuda::allow_next_grid_to_start();
  for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    int64_t at[2];
    offsets.get(i, at);
    out[at[0]] = accumulate_one(out[at[0]], in[at[1]]);
  }
}

// fill, contiguous: out[i] = value, kVec elements (16 bytes) per store.
// Bytes moved: n * sizeof(T).
template <typename T, int kVec>
__global__ void fill_contiguous_kernel(T* __restrict__ out, int64_t n, T value) {
  precis::cuda::wait_for_previous_grid();
  precis::cuda::allow_next_grid_to_start();
  Pack<T, kVec> pack;
#pragma unroll
  for (int k = 0; k < kVec; ++k) pack.v[k] = value;
  const int64_t packs = n / kVec;
  const int64_t first = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t p = first; p < packs; p += stride) {
    reinterpret_cast<Pack<T, kVec>*>(out)[p] = pack;
  }
  const int64_t tail = packs * kVec + first;
  if (tail < n) out[tail] = value;
}

// fill, strided: out[o(i)] = value. Bytes moved: n * sizeof(T).
template <typename T>
__global__ void fill_strided_kernel(T* out, uint32_t n, T value, StridedOffsets<1> offsets) {
  precis::cuda::wait_for_previous_grid();
  precis::cuda::allow_next_grid_to_start();
  for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    int64_t at[1];
    offsets.get(i, at);
    out[at[0]] = value;
  }
}

// ---------------------------------------------------------------- launchers

// contiguous(out, in, n) over dst and src when both are dense in one layout and aligned for kVec-element
// packs, else strided(out, in, count, offsets) over pieces of them (launch_strided).
template <int kVec, typename D, typename S, typename... ContiguousParams, typename... StridedParams>
void launch_pairwise(const Tensor& dst, const Tensor& src, const char* op, cudaStream_t stream,
                     void (*contiguous)(ContiguousParams...), void (*strided)(StridedParams...)) {
  const int64_t n = dst.numel();
  D* out = static_cast<D*>(dst.raw_data());
  const S* in = static_cast<const S*>(src.raw_data());
  // Two tensors of the same dense layout in any order of dims (both channels-last, say) are two
  // flat arrays whose i-th elements correspond.
  const bool flat = same_dense_layout(dst, src);
  if (flat && aligned(out, sizeof(D) * kVec) && aligned(in, sizeof(S) * kVec)) {
    precis::cuda::launch(contiguous, blocks_for(n / kVec), kBlockSize, 0, stream, out, in, n);
  } else {
    launch_strided<2>(dst.shape(), {&dst.strides(), &src.strides()}, op,
                      [&](const StridedOffsets<2>& offsets, std::array<int64_t, 2> base, uint32_t count) {
                        precis::cuda::launch(strided, blocks_for(count), kBlockSize, 0, stream, out + base[0],
                                             in + base[1], count, offsets);
                      });
  }
  PRECIS_CUDA_CHECK_LAUNCH(op);
}

// dst = convert(src), both on the current device.
void copy_on_device(const Tensor& dst, const Tensor& src) {
  cudaStream_t stream = compute_stream(dst.device());
  dispatch_any(dst.dtype(), "copy", [&](auto dst_tag) {
    using D = typename decltype(dst_tag)::type;
    dispatch_any(src.dtype(), "copy", [&](auto src_tag) {
      using S = typename decltype(src_tag)::type;
      constexpr int kVec = kVecFor<D, S>;
      launch_pairwise<kVec, D, S>(dst, src, "copy", stream, copy_contiguous_kernel<D, S, kVec>,
                                  copy_strided_kernel<D, S>);
    });
  });
}

void copy_host_to_device(const Tensor& dst, const Tensor& src) {
  cudaStream_t stream = compute_stream(dst.device());
  Tensor host = precis::dense(src);  // on the host
  const bool direct = dst.is_contiguous() && dst.dtype() == src.dtype();
  Tensor landing = direct ? dst : empty(src.shape(), src.dtype(), dst.device());
  PRECIS_CUDA_CHECK(cudaMemcpyAsync(landing.raw_data(), host.raw_data(), host.nbytes(), cudaMemcpyHostToDevice, stream),
                    "copy host to device");
  // A pinned source must not be reused before the copy has run; pageable memory was staged by the driver.
  record_pinned_use(host.raw_data(), stream, dst.device());
  if (!direct) copy_on_device(dst, landing);
}

void copy_device_to_host(const Tensor& dst, const Tensor& src) {
  cudaStream_t stream = compute_stream(src.device());
  Tensor dense = src;
  if (!src.is_contiguous() || src.dtype() != dst.dtype()) {
    dense = empty(src.shape(), dst.dtype(), src.device());
    copy_on_device(dense, src);
  }
  const bool direct = dst.is_contiguous();
  Tensor landing = direct ? dst : empty(dst.shape(), dst.dtype());
  // A copy into pageable memory waits in the driver for the stream to reach it, where no watcher
  // (core/cuda/wait_watch.h) sees the wait: wait, watched, first.
  if (!is_pinned_host(landing.raw_data())) synchronize_stream(stream, "copy device to host");
  PRECIS_CUDA_CHECK(
      cudaMemcpyAsync(landing.raw_data(), dense.raw_data(), dense.nbytes(), cudaMemcpyDeviceToHost, stream),
      "copy device to host");
  // Only a dense pinned destination may be left to arrive; anything else is read (or may be) on return.
  const bool leave_async = direct && record_pinned_use(dst.raw_data(), stream, src.device());
  if (!leave_async) synchronize_stream(stream, "copy device to host");
  if (!direct) precis::copy_(dst, landing);
}

// Between two GPUs: the source is made dense in the destination dtype on its own
// device, one peer copy moves the bytes, and the destination device lays them out.
// The peer copy runs on the source's compute stream after the destination's
// earlier work, and the destination's later work waits for it.
void copy_between_devices(const Tensor& dst, const Tensor& src) {
  Tensor dense = src;
  if (!src.is_contiguous() || src.dtype() != dst.dtype()) {
    DeviceGuard guard(src.device());
    dense = empty(src.shape(), dst.dtype(), src.device());
    copy_on_device(dense, src);
  }
  const bool direct = dst.is_contiguous();
  Tensor landing = direct ? dst : empty(dst.shape(), dst.dtype(), dst.device());
  cudaStream_t src_stream = compute_stream(src.device());
  cudaStream_t dst_stream = compute_stream(dst.device());
  cudaEvent_t dst_ready = nullptr, copied = nullptr;
  {
    DeviceGuard guard(dst.device());
    PRECIS_CUDA_CHECK(cudaEventCreateWithFlags(&dst_ready, cudaEventDisableTiming), "copy between GPUs");
    PRECIS_CUDA_CHECK(cudaEventRecord(dst_ready, dst_stream), "copy between GPUs");
  }
  {
    DeviceGuard guard(src.device());
    PRECIS_CUDA_CHECK(cudaStreamWaitEvent(src_stream, dst_ready, 0), "copy between GPUs");
    PRECIS_CUDA_CHECK(cudaMemcpyPeerAsync(landing.raw_data(), dst.device().index, dense.raw_data(), src.device().index,
                                          dense.nbytes(), src_stream),
                      "copy between GPUs");
    PRECIS_CUDA_CHECK(cudaEventCreateWithFlags(&copied, cudaEventDisableTiming), "copy between GPUs");
    PRECIS_CUDA_CHECK(cudaEventRecord(copied, src_stream), "copy between GPUs");
  }
  DeviceGuard guard(dst.device());
  PRECIS_CUDA_CHECK(cudaStreamWaitEvent(dst_stream, copied, 0), "copy between GPUs");
  if (!direct) copy_on_device(dst, landing);
  // Destroying a recorded event is safe: CUDA releases it once it has completed.
  PRECIS_CUDA_CHECK(cudaEventDestroy(dst_ready), "copy between GPUs");
  PRECIS_CUDA_CHECK(cudaEventDestroy(copied), "copy between GPUs");
}

}  // namespace

void copy_(const Tensor& dst, const Tensor& src) {
  if (dst.numel() == 0) return;
  if (dst.is_cuda() && src.is_cuda()) {
    if (dst.device() != src.device()) return copy_between_devices(dst, src);
    DeviceGuard guard(dst.device());
    return copy_on_device(dst, src);
  }
  if (dst.is_cuda()) {
    DeviceGuard guard(dst.device());
    return copy_host_to_device(dst, src);
  }
  DeviceGuard guard(src.device());
  copy_device_to_host(dst, src);
}

void fill_(const Tensor& dst, double value) {
  const int64_t n = dst.numel();
  if (n == 0) return;
  DeviceGuard guard(dst.device());
  cudaStream_t stream = compute_stream(dst.device());
  dispatch_any(dst.dtype(), "fill", [&](auto tag) {
    using T = typename decltype(tag)::type;
    constexpr int kVec = kVecFor<T, T>;
    const T v = convert_to<T>(value);
    T* out = static_cast<T*>(dst.raw_data());
    if (dst.is_contiguous() && aligned(out, sizeof(T) * kVec)) {
      precis::cuda::launch(fill_contiguous_kernel<T, kVec>, blocks_for(n / kVec), kBlockSize, 0, stream, out, n, v);
    } else {
      launch_strided<1>(dst.shape(), {&dst.strides()}, "fill",
                        [&](const StridedOffsets<1>& offsets, std::array<int64_t, 1> base, uint32_t count) {
                          precis::cuda::launch(fill_strided_kernel<T>, blocks_for(count), kBlockSize, 0, stream,
                                               out + base[0], count, v, offsets);
                        });
    }
    PRECIS_CUDA_CHECK_LAUNCH("fill");
  });
}

void accumulate_(const Tensor& dst, const Tensor& src) {
  PRECIS_CHECK(src.device() == dst.device(), "accumulate: a gradient on ", src.device(), " for a tensor on ",
               dst.device(), "; move it there first (.to(device))");
  const int64_t n = dst.numel();
  if (n == 0) return;
  DeviceGuard guard(dst.device());
  cudaStream_t stream = compute_stream(dst.device());
  dispatch_gradient(dst.dtype(), "accumulate", [&](auto dst_tag) {
    using D = typename decltype(dst_tag)::type;
    dispatch_gradient(src.dtype(), "accumulate", [&](auto src_tag) {
      using S = typename decltype(src_tag)::type;
      constexpr int kVec = kVecFor<D, S>;
      launch_pairwise<kVec, D, S>(dst, src, "accumulate", stream, accumulate_contiguous_kernel<D, S, kVec>,
                                  accumulate_strided_kernel<D, S>);
    });
  });
}

}  // namespace precis::cuda
