// Kernel launches with programmatic dependent launch (PDL): launch() for every
// kernel of ours, and the two device calls each of those kernels makes.
//
// Why: normally a kernel starts only after the previous kernel on its stream has
// completely finished: its last block has exited and its writes are flushed; only
// then are the next kernel's blocks scheduled. That hand-over leaves the GPU idle
// for a few microseconds per kernel, and a training step of hundreds of kernels adds
// those gaps up (bench/NOTES.md has GPT-2's measured figure).
//
// How: on sm_90 and newer, a kernel launched with the attribute
// cudaLaunchAttributeProgrammaticStreamSerialization may be scheduled before its
// predecessor on the stream has finished. Two PTX instructions keep that correct:
//
//   wait_for_previous_grid()    griddepcontrol.wait (= cudaGridDependencySynchronize()):
//                               blocks until the previous grid has completed and its
//                               memory writes are visible to this one.
//   allow_next_grid_to_start()  griddepcontrol.launch_dependents
//                               (= cudaTriggerProgrammaticLaunchCompletion()): lets the
//                               next kernel be scheduled once every block of this grid
//                               has executed it or exited. It never weakens
//                               correctness: the next kernel still waits for our full
//                               completion in its own wait_for_previous_grid().
//
// Both are no-ops when the kernel was not launched with the attribute, and compile
// to nothing for sm_80. Stream capture turns the attribute into programmatic edges
// of the CUDA graph (CUDA 12.3 and newer), so graph replays gain too.
//
// The rule for every kernel launched through launch():
//   its first statement is wait_for_previous_grid(), executed by every thread,
//   before any read or write of global memory and before any early return (a grid
//   whose threads all returned without waiting could complete before its
//   predecessor, and the kernel after it, which waits only for us, would then not
//   be ordered after that predecessor). Reading kernel parameters and index
//   arithmetic before it are fine. Right after it comes allow_next_grid_to_start():
//   at the top, so that for a grid of many waves the next kernel is scheduled into
//   the tail of the last wave.
// Exception: the flash-attention main kernels wait but do not trigger early; their
// blocks hold a lot of shared memory, and blocks of the next kernel parked on their
// wait would take SM slots from them.
// tests/core/test_dependent_launch.cpp checks that no <<<...>>> launch is left and
// that every kernel calls wait_for_previous_grid().
//
// Set PRECIS_PDL=0 in the environment to launch without the attribute (plain stream
// order), e.g. to rule PDL out when hunting a race.
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "core/cuda/runtime.h"
#include "core/tensor.h"

namespace precis::cuda {

// Blocks until the previous kernel on the stream has completed and its writes are visible.
__device__ __forceinline__ void wait_for_previous_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Lets the next kernel on the stream be scheduled once every block of this grid has called this or exited.
__device__ __forceinline__ void allow_next_grid_to_start() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Whether launch() adds the PDL attribute: the current device has compute capability
// 9.0 or newer and PRECIS_PDL is not "0" (decided once per process, core/cuda/runtime.cu),
// and no kernel trace has paused it (pause_dependent_launch in core/cuda/runtime.h).
bool dependent_launch_enabled();

// kernel<<<grid, block, shared_bytes, stream>>>(args...), with PDL where it is enabled.
// The arguments convert to the kernel's parameter types as they would with <<<>>>.
// Like <<<>>>, a failed launch is reported by cudaGetLastError(): follow the launch
// with PRECIS_CUDA_CHECK_LAUNCH(op) (core/cuda/runtime.h), which names the op.
template <typename... Params, typename... Args>
void launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes, cudaStream_t stream,
            Args&&... args) {
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream;
  config.attrs = &attribute;
  config.numAttrs = dependent_launch_enabled() ? 1 : 0;
  // The error, if any, is also recorded for cudaGetLastError(), where the caller's check finds it.
  (void)cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

// launch() for a kernel with more than the default 48 KiB of dynamic shared memory, which
// each kernel must first be allowed (cudaFuncAttributeMaxDynamicSharedMemorySize).
template <typename... Params, typename... Args>
void launch_with_shared_memory(void (*kernel)(Params...), dim3 grid, dim3 block, int shared_bytes, cudaStream_t stream,
                               const char* op, Args&&... args) {
  PRECIS_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, shared_bytes), op);
  launch(kernel, grid, block, static_cast<size_t>(shared_bytes), stream, std::forward<Args>(args)...);
}

// launch_with_shared_memory() in clusters of `cluster` blocks along x (sm_90; gridDim.x a
// multiple of it): the blocks of a cluster run at once on one GPC and may reach each other's
// shared memory. With PDL where launch() would add it.
template <typename... Params, typename... Args>
void launch_clusters_with_shared_memory(void (*kernel)(Params...), dim3 grid, dim3 block, int shared_bytes,
                                        unsigned cluster, cudaStream_t stream, const char* op, Args&&... args) {
  PRECIS_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, shared_bytes), op);
  cudaLaunchAttribute attributes[2]{};
  attributes[0].id = cudaLaunchAttributeClusterDimension;
  attributes[0].val.clusterDim.x = cluster;
  attributes[0].val.clusterDim.y = 1;
  attributes[0].val.clusterDim.z = 1;
  attributes[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attributes[1].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = static_cast<size_t>(shared_bytes);
  config.stream = stream;
  config.attrs = attributes;
  config.numAttrs = dependent_launch_enabled() ? 2 : 1;
  (void)cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

// Makes t's device current and returns its compute stream: every kernel of an op runs there, in order.
inline cudaStream_t stream_for(const Tensor& t) {
  set_device(t.device());
  return compute_stream(t.device());
}

}  // namespace precis::cuda
