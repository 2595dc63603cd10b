// Trial (bench/NOTES.md, thirteenth session, item 8; temporary): memset nodes hoisted out of
// a captured graph's chain, PRECIS_AB_MEMSET_HOIST=plain|pdl (off when unset or 0).
//
// cuBLASLt queues a 4-byte memset before every product of GPT-2's whose output has the
// 16384 token rows (a counter it keeps in its workspace, it seems): 99 of a step's 160
// products. In the replayed graph each such node costs ~4.3 us of gaps (~0.47 ms a step),
// where a product that follows one of our kernels directly starts at once. With the switch,
// each product captured gets its own slice of a workspace arena (ops/cuda/cublaslt.cu), which
// it registers here as hoistable: a memset node whose target lies in a registered range, the
// only one aimed at that range, is removed after the capture (its successors take
// its predecessors, with a plain edge, or with `pdl` a programmatic one between two kernels,
// as the capture makes for a kernel launched with PDL after another), and one memset node at
// the graph's start zeroes the span of all the removed targets before every replay. Only
// `pdl` keeps the product's early start; it is right only if cuBLASLt's kernels wait for the
// kernel before them (griddepcontrol.wait), which their launches with PDL promise.
//
// Include only from files built with PRECIS_WITH_CUDA.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

namespace precis::cuda {

enum class MemsetHoist { off, plain, pdl };

// PRECIS_AB_MEMSET_HOIST, read once (an unknown value is an error naming the choices), unless
// set_memset_hoisting chose already (tests).
MemsetHoist memset_hoisting();
void set_memset_hoisting(MemsetHoist mode);

// The capture under way (one at a time) gives a product [begin, begin + bytes) of its own: a
// memset whose target lies there, the only memset aimed at that range in the graph, may run
// once at the graph's start instead (another kernel of the same product might reuse the bytes
// of a second target as scratch). reset_hoistable_ranges forgets the last capture's ranges.
void register_hoistable_range(const void* begin, size_t bytes);
void reset_hoistable_ranges();

// The hoisting above, on a captured graph (not instantiated yet); returns the memset nodes
// removed (0: the graph is as it was).
size_t hoist_memsets(cudaGraph_t graph, MemsetHoist mode);

}  // namespace precis::cuda
