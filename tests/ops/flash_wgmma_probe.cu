// Probes of the wgmma products of the sm_90a flash-attention forward and backward, for
// tests/ops/test_flash_wgmma_gpu.cpp (declared in tests/ops/flash_wgmma_probe.h): one warpgroup runs the forward's own
// code path (paneled tiles filled by cp.async, descriptors, wgmma wrappers, the accumulator-to-A conversion;
// ops/cuda/flash_wgmma.cuh) on one tile and writes the f32 accumulators out, so a wrong descriptor field or register
// layout shows element by element against a CPU product. Assembled in the sm_90a pass only, like the forward.
#include "core/cuda/dispatch.cuh"
#include "core/cuda/launch.cuh"
#include "ops/cuda/flash_attention_sm90.h"
#include "ops/cuda/flash_params.cuh"
#include "ops/cuda/flash_wgmma.cuh"
#include "ops/flash_wgmma_probe.h"

namespace precis::ops::cuda {

namespace {

using namespace flash;

constexpr int kProbeThreads = 128;  // one warpgroup
// The scores probe keeps its 64 rows of A in rows 64..127 of a 128-row tile, as the
// forward's second warpgroup reads its Q rows, so the descriptors' row offset is tested too.
constexpr int kProbeQRows = 128, kProbeRow0 = 64;

template <typename T>
__device__ __forceinline__ T* tile_start(unsigned char* smem) {
  return reinterpret_cast<T*>((reinterpret_cast<uintptr_t>(smem) + kSwizzleAtomBytes - 1) &
                              ~uintptr_t(kSwizzleAtomBytes - 1));
}

__device__ __forceinline__ void tiles_landed() {
  cp_async_commit();
  cp_async_wait<0>();
  fence_shared_for_tensor_cores();
  __syncthreads();
}

// Writes this thread's accumulators of a 64 x kN product to out (f32, row stride ld).
template <int kN>
__device__ __forceinline__ void store_accumulators(float* out, int ld, const float (&d)[kN / 2], int tid) {
  const int lane = tid % 32, row0 = 16 * (tid / 32) + lane / 4;
#pragma unroll
  for (int j = 0; j < kN / 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) out[(row0 + 8 * (e >> 1)) * ld + 8 * j + 2 * (lane % 4) + (e & 1)] = d[4 * j + e];
}

// This thread's accumulators of a 64 x kN product from x (f32, row stride ld).
template <int kN>
__device__ __forceinline__ void load_accumulators(float (&d)[kN / 2], const float* x, int ld, int tid) {
  const int lane = tid % 32, row0 = 16 * (tid / 32) + lane / 4;
#pragma unroll
  for (int j = 0; j < kN / 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) d[4 * j + e] = x[(row0 + 8 * (e >> 1)) * ld + 8 * j + 2 * (lane % 4) + (e & 1)];
}

// out [64, kN] = a [64, kD] b [kN, kD]^T through issue_scores.
template <typename T, int kD, int kN>
__global__ void __launch_bounds__(kProbeThreads) wgmma_scores_probe(const T* a, const T* b, float* out) {
  if constexpr (kSm90aPass) {
    extern __shared__ unsigned char smem_raw[];
    T* sA = tile_start<T>(smem_raw);
    T* sB = sA + kProbeQRows * kD;
    const int tid = threadIdx.x;
    constexpr int kChunksPerRow = kD / 8;
    for (int chunk = tid; chunk < kProbeQRows * kChunksPerRow; chunk += kProbeThreads) {
      const int row = chunk / kChunksPerRow, col = (chunk % kChunksPerRow) * 8;
      const bool valid = row >= kProbeRow0;  // rows above the probed ones hold zeros
      cp_async_16(sA + panel_offset<kProbeQRows>(row, col), valid ? a + (row - kProbeRow0) * kD + col : a, valid);
    }
    load_panels_async<kN, kD, kProbeThreads>(sB, b, kD, kN, tid);
    tiles_landed();
    float d[kN / 2];
    wgmma_fence();
    issue_scores<T, kD, kN, kProbeQRows>(d, sA, kProbeRow0, sB);
    wgmma_commit();
    wgmma_wait<0>();
    fence_registers(d);
    store_accumulators<kN>(out, kN, d, tid);
  }
}

// out [64, kD] = round(p) [64, kN] b [kN, kD] through accumulators_to_a and issue_values.
template <typename T, int kD, int kN>
__global__ void __launch_bounds__(kProbeThreads) wgmma_values_probe(const float* p, const T* b, float* out) {
  if constexpr (kSm90aPass) {
    extern __shared__ unsigned char smem_raw[];
    T* sB = tile_start<T>(smem_raw);
    const int tid = threadIdx.x;
    load_panels_async<kN, kD, kProbeThreads>(sB, b, kD, kN, tid);
    tiles_landed();
    float s[kN / 2];  // p in the layout of score accumulators
    load_accumulators<kN>(s, p, kN, tid);
    uint32_t pa[kN / 16][4];
    accumulators_to_a<T, kN>(pa, s);
    float o[kD / 2];
#pragma unroll
    for (int i = 0; i < kD / 2; ++i) o[i] = 0.f;
    fence_registers(o);
    wgmma_fence();
    issue_values<T, kD, kN>(o, pa, sB);
    wgmma_commit();
    wgmma_wait<0>();
    fence_registers(o);
    store_accumulators<kD>(out, kD, o, tid);
  }
}

// out [64, 64] = round(a)^T [64, 128] b [128, 64] as the backward's dQ = dS K: a (f32
// [128, 64], dS^T) in two 64-row halves of accumulators, through accumulators_to_a and
// store_a_to_panels into a [128][64] tile; b into a [128][64] tile; two products of 32
// columns through issue_transposed_product.
constexpr int kProbeKeys = 128, kProbeCols = 64;
template <typename T>
__global__ void __launch_bounds__(kProbeThreads) wgmma_transposed_probe(const float* a, const T* b, float* out) {
  if constexpr (kSm90aPass) {
    extern __shared__ unsigned char smem_raw[];
    T* sA = tile_start<T>(smem_raw);
    T* sB = sA + kProbeKeys * kProbeCols;
    const int tid = threadIdx.x;
    load_panels_async<kProbeKeys, kProbeCols, kProbeThreads>(sB, b, kProbeCols, kProbeKeys, tid);
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      float s[kProbeCols / 2];
      load_accumulators<kProbeCols>(s, a + half * 64 * kProbeCols, kProbeCols, tid);
      uint32_t ra[kProbeCols / 16][4];
      accumulators_to_a<T, kProbeCols>(ra, s);
      store_a_to_panels<T, kProbeKeys, kProbeCols>(sA, 64 * half, ra, tid);
    }
    tiles_landed();
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      float d[kProbeCols / 4];
      fence_registers(d);
      wgmma_fence();
      issue_transposed_product<T, kProbeKeys, kProbeCols / 2>(d, sA, sB, 32 * half);
      wgmma_commit();
      wgmma_wait<0>();
      fence_registers(d);
      store_accumulators<kProbeCols / 2>(out + 32 * half, kProbeCols, d, tid);
    }
  }
}

template <typename Kernel>
void allow_shared_memory(Kernel kernel, int bytes, const char* op) {
  PRECIS_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes), op);
}

// Calls fn(T{}, D tag, N tag) for the dtype of t and the (D, N) pair.
template <typename Fn>
void with_shape(const Tensor& t, int64_t D, int64_t N, const char* op, Fn&& fn) {
  PRECIS_CHECK((D == 64 || D == 128) && (N == 64 || N == 128), op, ": D and N must be 64 or 128, got ", D, " and ", N);
  auto by_n = [&](auto type_tag, auto d_tag) {
    if (N == 64)
      fn(type_tag, d_tag, std::integral_constant<int, 64>{});
    else
      fn(type_tag, d_tag, std::integral_constant<int, 128>{});
  };
  auto by_d = [&](auto type_tag) {
    if (D == 64)
      by_n(type_tag, std::integral_constant<int, 64>{});
    else
      by_n(type_tag, std::integral_constant<int, 128>{});
  };
  precis::cuda::dispatch_half(t.dtype(), op, [&](auto tag) { by_d(typename decltype(tag)::type{}); });
}

void check_probe_inputs(const Tensor& x, const Tensor& b, const Tensor& out, const char* op) {
  PRECIS_CHECK(x.dim() == 2 && b.dim() == 2 && out.dim() == 2, op, ": 2-d operands");
  PRECIS_CHECK(sm90a_code_loaded(b.device()), op, ": needs the sm_90a build on a compute-capability 9.0 GPU");
  PRECIS_CHECK(x.is_contiguous() && b.is_contiguous() && out.is_contiguous() && out.dtype() == DType::f32 &&
                   x.device() == b.device() && out.device() == b.device(),
               op, ": contiguous operands on one GPU and an f32 output");
}

}  // namespace

void wgmma_probe_scores(const Tensor& a, const Tensor& b, const Tensor& out) {
  const char* op = "wgmma_probe_scores";
  check_probe_inputs(a, b, out, op);
  const int64_t D = a.size(1), N = b.size(0);
  PRECIS_CHECK(a.size(0) == 64 && b.size(1) == D && a.dtype() == b.dtype() && out.shape() == (Shape{64, N}), op,
               ": a [64, D], b [N, D], out [64, N]");
  cudaStream_t stream = precis::cuda::stream_for(b);
  with_shape(b, D, N, op, [&](auto type_tag, auto d_tag, auto n_tag) {
    using T = decltype(type_tag);
    constexpr int kD = decltype(d_tag)::value, kN = decltype(n_tag)::value;
    constexpr int kSmemBytes = (kProbeQRows + kN) * kD * 2 + kSwizzleAtomBytes;
    allow_shared_memory(wgmma_scores_probe<T, kD, kN>, kSmemBytes, op);
    wgmma_scores_probe<T, kD, kN><<<1, kProbeThreads, kSmemBytes, stream>>>(
        static_cast<const T*>(a.raw_data()), static_cast<const T*>(b.raw_data()), static_cast<float*>(out.raw_data()));
  });
  PRECIS_CUDA_CHECK_LAUNCH(op);
}

void wgmma_probe_values(const Tensor& p, const Tensor& b, const Tensor& out) {
  const char* op = "wgmma_probe_values";
  check_probe_inputs(p, b, out, op);
  const int64_t N = p.size(1), D = b.size(1);
  PRECIS_CHECK(p.size(0) == 64 && p.dtype() == DType::f32 && b.size(0) == N && out.shape() == (Shape{64, D}), op,
               ": p [64, N] f32, b [N, D], out [64, D]");
  cudaStream_t stream = precis::cuda::stream_for(b);
  with_shape(b, D, N, op, [&](auto type_tag, auto d_tag, auto n_tag) {
    using T = decltype(type_tag);
    constexpr int kD = decltype(d_tag)::value, kN = decltype(n_tag)::value;
    constexpr int kSmemBytes = kN * kD * 2 + kSwizzleAtomBytes;
    allow_shared_memory(wgmma_values_probe<T, kD, kN>, kSmemBytes, op);
    wgmma_values_probe<T, kD, kN><<<1, kProbeThreads, kSmemBytes, stream>>>(static_cast<const float*>(p.raw_data()),
                                                                            static_cast<const T*>(b.raw_data()),
                                                                            static_cast<float*>(out.raw_data()));
  });
  PRECIS_CUDA_CHECK_LAUNCH(op);
}

void wgmma_probe_transposed(const Tensor& a, const Tensor& b, const Tensor& out) {
  const char* op = "wgmma_probe_transposed";
  check_probe_inputs(a, b, out, op);
  PRECIS_CHECK(a.shape() == (Shape{kProbeKeys, kProbeCols}) && a.dtype() == DType::f32 &&
                   b.shape() == (Shape{kProbeKeys, kProbeCols}) &&
                   (b.dtype() == DType::bf16 || b.dtype() == DType::f16) && out.shape() == (Shape{64, kProbeCols}),
               op, ": a [128, 64] f32, b [128, 64] f16 or bf16, out [64, 64]");
  cudaStream_t stream = precis::cuda::stream_for(b);
  constexpr int kSmemBytes = 2 * kProbeKeys * kProbeCols * 2 + kSwizzleAtomBytes;
  precis::cuda::dispatch_half(b.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    allow_shared_memory(wgmma_transposed_probe<T>, kSmemBytes, op);
    wgmma_transposed_probe<T><<<1, kProbeThreads, kSmemBytes, stream>>>(static_cast<const float*>(a.raw_data()),
                                                                        static_cast<const T*>(b.raw_data()),
                                                                        static_cast<float*>(out.raw_data()));
  });
  PRECIS_CUDA_CHECK_LAUNCH(op);
}

}  // namespace precis::ops::cuda
