// Memset nodes moved out of a captured graph's chain (bench/NOTES.md, thirteenth and fourteenth
// sessions).
//
// cuBLASLt queues a 4-byte memset before every product of GPT-2's whose output has the 16384
// token rows (a counter it keeps in its workspace: 99 of a step's 160 products), cuDNN one
// before some convolutions (about 20 in a ResNet-18 step). In a replayed graph each such node
// breaks the chain of kernels: the product after it cannot start early as it does after one of
// our kernels (launched with PDL), and each costs a few microseconds of gaps.
//
// So while a capture is under way, each library call gets a workspace slice of its own
// (capture_workspace below), and after the capture a memset node whose target lies in such a
// slice, the only one aimed at it, is removed: its successors take its predecessors, and one
// kernel at the graph's start zeroes all the removed targets before every replay (up to 255 of
// them; any further memset stays where it is). A new edge between two kernels is programmatic
// (PDL) when the successor's function is one the capture gave a programmatic edge elsewhere:
// its launcher asked for PDL, so it waits for the kernel before it (griddepcontrol.wait). Any
// other edge is plain, and so is every edge with PRECIS_PDL=0.
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
// `stream` while a capture is under way: a slice of its own, taken from the caching allocator
// during the capture (so from the capture's private pool) and kept until
// release_capture_workspaces: a memset whose target lies there, the only memset aimed at that
// slice in the graph, may run once at the graph's start instead (another kernel of the same
// call might reuse the bytes of a second target as scratch). Null when hoisting is off, no
// capture is under way on `stream`, or `bytes` is 0 or over 1 MiB: the caller then uses its
// usual workspace. The slices cost memory only while their graph lives: GPT-2's 160 products
// need a few KiB.
void* capture_workspace(Device device, cudaStream_t stream, size_t bytes);
// Frees the slices handed out during the capture with id `capture` (cudaStreamGetCaptureInfo),
// once its graph is destroyed or the capture abandoned (CudaGraph does it).
void release_capture_workspaces(unsigned long long capture);

// The hoisting above, on the graph captured with id `capture` (not instantiated yet); returns
// the memset nodes removed (0: the graph is as it was, as it is with hoisting off).
size_t hoist_memsets(cudaGraph_t graph, unsigned long long capture);

}  // namespace precis::cuda
