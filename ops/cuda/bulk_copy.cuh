// Shared-memory addresses, and bulk copies from global into shared memory by the copy engine
// of sm_90 (the TMA unit), as inline-PTX wrappers a reader can check against the PTX manual
// ("Data Movement and Conversion Instructions: cp.async.bulk", "mbarrier"):
//
//   mbarrier            a 64-bit barrier object in shared memory; here each is used for one
//                       phase (parity 0): initialised with one expected arrival, then armed by
//                       one thread with the number of bytes to come (arrive.expect_tx); it
//                       completes when those bytes have landed (complete_tx), and threads
//                       wait for that with try_wait.parity.
//   cp.async.bulk       `bytes` (a multiple of 16, both addresses 16-byte aligned) copied
//                       global -> shared by the copy engine, issued by one thread, with no
//                       registers and no per-thread loads; it reports to an mbarrier.
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
