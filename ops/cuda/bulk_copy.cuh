// Shared-memory addresses, a thread's own asynchronous copies into shared memory (cp.async),
// and bulk copies from global into shared memory by the copy engine
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
//   Clusters (CTAs launched together on one GPC, sm_90): a copy may multicast its box to the
//   same offset in several CTAs of the cluster, and a thread may arrive on another CTA's
//   mbarrier (mapa gives its address in the cluster's shared window).
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

// ---- asynchronous copies by a thread (cp.async, sm_80 on): each thread copies its own bytes
// global -> shared without holding them in registers, in groups it commits and waits for; a
// thread sees its own copies once their group is waited for (no barrier needed for that).

// 16 bytes global -> shared; when !valid the destination is zero-filled and src is not read.
__device__ __forceinline__ void cp_async_16(void* dst, const void* src, bool valid) {
  const int bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_address(dst)), "l"(src), "r"(bytes));
}
// 4 bytes global -> shared (for rows of per-query floats, which need not be 16-byte aligned).
__device__ __forceinline__ void cp_async_4(void* dst, const void* src, bool valid) {
  const int bytes = valid ? 4 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_address(dst)), "l"(src), "r"(bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
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

// Copies the box at coordinates (c0, c1) (innermost first, in elements) of the 2-d tensor map
// `map` (a __grid_constant__ kernel parameter or global memory) to dst (shared, aligned as the
// map's swizzle needs: 1024 bytes for 128-byte swizzle); the box's bytes count against
// `barrier` as they land.
__device__ __forceinline__ void tensor_copy_2d_to_shared(void* dst, const void* map, int c0, int c1,
                                                         uint64_t* barrier) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], "
      "[%4];\n" ::"r"(smem_address(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(smem_address(barrier))
      : "memory");
}

// tensor_copy_2d_to_shared's box written at dst's offset in every CTA of the cluster whose bit
// is set in cta_mask (multicast), its bytes counted against the mbarrier at `barrier`'s offset
// in each of them.
__device__ __forceinline__ void tensor_copy_2d_to_cluster(void* dst, const void* map, int c0, int c1, uint64_t* barrier,
                                                          uint16_t cta_mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster [%0], "
      "[%1, {%2, %3}], [%4], %5;\n" ::"r"(smem_address(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(smem_address(barrier)), "h"(cta_mask)
      : "memory");
}

// The other direction: the box at coordinates (c0, c1) of `map` written from src (shared,
// laid out as tensor_copy_2d_to_shared would have written it) to global memory, in whole
// lines, by the copy engine; the copy joins this thread's current bulk group
// (bulk_store_commit). The threads that wrote src must have run fence_shared_to_async_proxy
// and a barrier with the issuing thread first.
__device__ __forceinline__ void tensor_store_2d_from_shared(const void* map, int c0, int c1, const void* src) {
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];\n" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(c0), "r"(c1), "r"(smem_address(src))
               : "memory");
}

// Closes this thread's bulk group of stores issued since the last commit.
__device__ __forceinline__ void bulk_store_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }

// Waits until at most kPending of this thread's committed bulk groups have not yet READ their
// shared-memory source (the source may then be overwritten; the global writes may still be
// on their way).
template <int kPending>
__device__ __forceinline__ void bulk_store_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(kPending) : "memory");
}

// Waits until all of this thread's committed bulk groups are complete (written to global).
__device__ __forceinline__ void bulk_store_wait_all() { asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory"); }

// Orders this thread's generic-proxy writes to shared memory before later async-proxy (copy
// engine) reads of them.
__device__ __forceinline__ void fence_shared_to_async_proxy() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// One arrival on the mbarrier at `barrier`'s offset in CTA `cta_rank` of this cluster (this CTA
// included).
__device__ __forceinline__ void mbarrier_arrive_in_cta(uint64_t* barrier, uint32_t cta_rank) {
  asm volatile(
      "{\n.reg .b32 remote;\nmapa.shared::cluster.u32 remote, %0, %1;\n"
      "mbarrier.arrive.shared::cluster.b64 _, [remote];\n}\n" ::"r"(smem_address(barrier)),
      "r"(cta_rank)
      : "memory");
}

// This CTA's rank in its cluster.
__device__ __forceinline__ uint32_t cluster_cta_rank() {
  uint32_t rank;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(rank));
  return rank;
}

// Every thread of every CTA of the cluster: arrive (releasing its shared-memory writes and
// mbarrier inits) and wait for all the others (acquiring theirs). Threads of a warp need not
// be converged.
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;\n" ::: "memory");
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
