// Pinned (page-locked) host tensors: the staging buffers of fast host<->device
// copies. The GPU reads and writes pinned memory directly, so copy_ between a
// pinned tensor and a GPU tensor is queued on the device's compute stream and
// returns at once, and the data loader's next batch crosses the bus while the
// current step computes.
//
// What that means for the caller:
//   - host -> device: the pinned tensor may be dropped right after copy_ (its
//     memory is not reused before the copy has run), but it must not be written
//     again until the copy has run: use one pinned buffer per batch in flight,
//     or synchronize() first.
//   - device -> host: copy_ returns before the data has arrived; call
//     synchronize(device) before reading the pinned tensor. (Copies into
//     ordinary CPU tensors wait for the data themselves.)
//
// Without a GPU (a CPU-only build, or a CUDA build on a machine with no usable
// GPU) pinning means nothing: empty_pinned returns an ordinary CPU tensor, and
// the code that uses it runs unchanged.
#pragma once

#include "core/tensor.h"

namespace precis {

// An uninitialised CPU tensor in pinned memory (ordinary memory without a GPU).
Tensor empty_pinned(const Shape& shape, DType dtype = DType::f32);
// Whether `t` lives in pinned memory from empty_pinned.
bool is_pinned(const Tensor& t);
// Waits until all work queued on the compute stream of `device` has run.
// Returns at once for the CPU.
void synchronize(Device device);

}  // namespace precis
