// Memset nodes moved out of a captured graph's chain (bench/NOTES.md, thirteenth and fourteenth
// sessions).
//
// cuBLASLt queues a 4-byte memset before every product of GPT-2's whose output has the 16384
// token rows (a counter it keeps in its workspace: 99 of a step's 160 products), cuDNN one before
// some convolutions (about 20 in a ResNet-18 step). In a replayed graph each such node breaks the
// chain of kernels: the product after it cannot start early as it does after one of our kernels
// (launched with PDL), and each costs a few microseconds of gaps. So while a capture is under
// way, each library call gets its own slice of a workspace arena (capture_workspace below), and
// after the capture a memset node whose target lies in such a slice, the only one aimed at it, is
// removed: its successors take its predecessors, and one memset node at the graph's start zeroes
// the span of all the removed targets before every replay. The new edge between two kernels is
// programmatic (PDL) when the successor's function is one the capture gave a programmatic edge
// elsewhere: its launcher asked for PDL, so it waits for the kernel before it (griddepcontrol.wait).
// Any other edge is plain, and so is every edge with PRECIS_PDL=0.
//
// Include only from files built with PRECIS_WITH_CUDA.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "core/device.h"

namespace precis::cuda {

// On unless a test turned it off (tests/ops/test_memset_hoist_gpu.cpp compares both).
bool memset_hoisting();
void set_memset_hoisting(bool on);

// The workspace of one library call (a cuBLASLt product, a cuDNN convolution) queued on
// `stream` while a capture is under way: its own slice of `device`'s capture arena (64 MiB,
// handed out in order from its start for each capture), registered as hoistable: a memset whose
// target lies there, the only memset aimed at that slice in the graph, may run once at the
// graph's start instead (another kernel of the same call might reuse the bytes of a second
// target as scratch). Null when hoisting is off, no capture is under way on `stream`, the arena
// was not made, `bytes` is 0 or over 1 MiB, or the arena is used up: the caller then uses its
// usual workspace.
void* capture_workspace(Device device, cudaStream_t stream, size_t bytes);
// Makes `device`'s capture arena if hoisting is on and none is yet, unless a capture is under
// way (no memory may be taken then): CudaGraph::capture calls it before it begins.
void prepare_capture_arena(Device device);

// The hoisting above, on a captured graph (not instantiated yet); returns the memset nodes
// removed (0: the graph is as it was, as it is with hoisting off).
size_t hoist_memsets(cudaGraph_t graph);

}  // namespace precis::cuda
