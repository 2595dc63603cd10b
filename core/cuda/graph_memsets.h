// Trial (bench/NOTES.md, thirteenth session, item 8; temporary): memset nodes hoisted out of
// a captured graph's chain, PRECIS_AB_MEMSET_HOIST=plain|pdl (off when unset or 0).
//
// cuBLASLt queues a 4-byte memset before every product of GPT-2's whose output has the
// 16384 token rows (a counter it keeps in its workspace, it seems): 99 of a step's 160
// products; cuDNN one before some convolutions (19 in a ResNet-18 step). In the replayed graph
// each such node costs ~4.3 us of gaps (~0.47 ms a GPT-2 step), where a product that follows
// one of our kernels directly starts at once. With the switch, each call captured gets its own
// slice of a workspace arena (capture_workspace below), and a memset node whose target lies in
// such a slice, the only one aimed at it, is removed after the capture: its successors take
// its predecessors, with a plain edge, or with `pdl` a programmatic one between two kernels
// (as the capture makes for a kernel launched with PDL after another), and one memset node at
// the graph's start zeroes the span of all the removed targets before every replay. Only
// `pdl` keeps the product's early start; it is right only if the libraries' kernels wait for
// the kernel before them (griddepcontrol.wait), which their launches with PDL promise.
//
// Include only from files built with PRECIS_WITH_CUDA.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "core/device.h"

namespace precis::cuda {

enum class MemsetHoist { off, plain, pdl };

// PRECIS_AB_MEMSET_HOIST, read once (an unknown value is an error naming the choices), unless
// set_memset_hoisting chose already (tests).
MemsetHoist memset_hoisting();
void set_memset_hoisting(MemsetHoist mode);

// The workspace of one library call (a cuBLASLt product, a cuDNN convolution) queued on
// `stream` while a capture is under way, with the switch on: its own slice of `device`'s
// capture arena (64 MiB, handed out in order from its start for each capture), registered as
// hoistable: a memset whose target lies there, the only memset aimed at that slice in the
// graph, may run once at the graph's start instead (another kernel of the same call might
// reuse the bytes of a second target as scratch). Null when the switch is off, no capture is
// under way on `stream`, the arena was not made yet, `bytes` is 0 or over 1 MiB, or the arena
// is used up: the caller then uses its usual workspace.
void* capture_workspace(Device device, cudaStream_t stream, size_t bytes);
// Makes `device`'s capture arena if the switch is on and none is yet, unless a capture is under
// way (no memory may be taken then): call it from the eager calls before a capture.
void prepare_capture_arena(Device device);

// The hoisting above, on a captured graph (not instantiated yet); returns the memset nodes
// removed (0: the graph is as it was).
size_t hoist_memsets(cudaGraph_t graph, MemsetHoist mode);

}  // namespace precis::cuda
