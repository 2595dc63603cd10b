// Shared-memory addresses, and bulk copies from global into shared memory by the copy engine
// of sm_90 (the TMA unit), as inline-PTX wrappers a reader can check against the PTX manual
// ("Data Movement and Conversion Instructions: cp.async.bulk", "mbarrier"):
//
//   mbarrier            a 64-bit barrier object in shared memory, initialised with the number
//                       of arrivals a phase; for a copy, one expected arrival, armed by one
//                       thread with the number of bytes to come (arrive.expect_tx); a phase
//                       completes when its arrivals and bytes have landed (complete_tx), and
//                       threads wait for that with try_wait.parity (the first phase has
//                       parity 0).
//   cp.async.bulk       `bytes` (a multiple of 16, both addresses 16-byte aligned) copied
//                       global -> shared by the copy engine, issued by one thread, with no
//                       registers and no per-thread loads; it reports to an mbarrier.
//   cp.async.bulk.tensor  the same for a box of a tensor described by a tensor map
//                       (CUtensorMap, built on the host: ops/cuda/tensor_map.h): the copy
//                       engine computes the addresses from the box's coordinates, fills the
//                       elements outside the tensor with zeros, and lays the box out in shared
//                       memory with the map's swizzle; the whole box's bytes count.
//   An mbarrier used for many phases (a ring of stages) alternates its parity 0, 1, 0, ...
//
// Why: a block that stages a long row in shared memory can then ask for the whole row at once,
// as many bytes in flight as the row holds, where loads by its threads keep only a few 16-byte
// packs a thread in flight and stall the thread until they land.
//
// The bulk and mbarrier instructions assemble for sm_90 and newer only: call them from code
// compiled where __CUDA_ARCH__ >= 900, and launch that code only on such devices.
#pragma once

#include <cstdint>

namespace precis::ops::cuda {

__device__ __forceinline__ uint32_t smem_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Initialises the mbarrier at `barrier` (shared memory) for `arrivals` arrivals a phase.
__device__ __forceinline__ void mbarrier_init(uint64_t* barrier, uint32_t arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_address(barrier)), "r"(arrivals) : "memory");
}

// Makes this thread's mbarrier_init calls visible to the copy engine (the async proxy) before
// it completes bytes on them; the other threads still need a barrier before they wait on them.
__device__ __forceinline__ void fence_mbarrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

// One arrival on `barrier` that also tells it to expect `bytes` more before the phase completes.
__device__ __forceinline__ void mbarrier_arrive_expect_bytes(uint64_t* barrier, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_address(barrier)), "r"(bytes)
               : "memory");
}

// Copies `bytes` from src (global) to dst (shared), both 16-byte aligned, bytes a multiple of
// 16, asynchronously; the bytes count against `barrier` as they land.
__device__ __forceinline__ void bulk_copy_to_shared(void* dst, const void* src, uint32_t bytes, uint64_t* barrier) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                   smem_address(dst)),
               "l"(src), "r"(bytes), "r"(smem_address(barrier))
               : "memory");
}

// One arrival on `barrier` (no bytes).
__device__ __forceinline__ void mbarrier_arrive(uint64_t* barrier) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_address(barrier)) : "memory");
}

// Copies the box at coordinates (c0, c1, c2, c3) (innermost first, in elements) of the 4-d
// tensor map `map` (a __grid_constant__ kernel parameter or global memory) to dst (shared,
// aligned as the map's swizzle needs: 1024 bytes for 128-byte swizzle); the box's bytes count
// against `barrier` as they land.
__device__ __forceinline__ void tensor_copy_4d_to_shared(void* dst, const void* map, int c0, int c1, int c2, int c3,
                                                         uint64_t* barrier) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], "
      "[%6];\n" ::"r"(smem_address(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(smem_address(barrier))
      : "memory");
}

// Fetches the tensor map into the copy engine's cache ahead of its first copy.
__device__ __forceinline__ void prefetch_tensor_map(const void* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

// Waits until the phase of `barrier` with this parity has completed (its arrivals and bytes).
__device__ __forceinline__ void mbarrier_wait(uint64_t* barrier, uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "LAB_WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra LAB_WAIT;\n"
      "}\n" ::"r"(smem_address(barrier)),
      "r"(parity)
      : "memory");
}

}  // namespace precis::ops::cuda
