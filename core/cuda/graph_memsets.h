// Small memset nodes of a captured graph, replaced by kernel nodes that store the same bytes.
//
// cuBLASLt zeroes a 4-byte counter in its workspace before most of its Hopper kernels
// (cudaMemsetAsync), ~100 times a GPT-2 step. In a replayed graph each such memset node cost
// ~3.5 us (its own ~0.8 us and the gaps either side, 1.45 us before it and 2.26 after, where a
// kernel follows a kernel by ~0.3-1 us: bench/NOTES.md, the eleventh session), ~0.35 ms a step.
// A kernel node that writes the same bytes runs in line with the kernels around it.
// Only memsets of at most kSmallMemsetBytes are replaced: a large one runs at the copy
// engine's bandwidth, and its launch is a small part of its time.
//
// Include only from files built with PRECIS_WITH_CUDA.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

namespace precis::cuda {

inline constexpr size_t kSmallMemsetBytes = size_t{64} << 10;

// Replaces every memset node of `graph` that sets at most kSmallMemsetBytes, and whose edges
// are plain ones, by a kernel node with the same dependencies and dependents; returns how many
// it replaced. `graph` must not be instantiated yet.
size_t replace_small_memsets(cudaGraph_t graph);

// The memset nodes of `graph`.
size_t count_memset_nodes(cudaGraph_t graph);

}  // namespace precis::cuda
