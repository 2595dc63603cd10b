// The side stream of a device: work that nothing on the compute stream needs until a known
// point runs there, beside the compute stream's (core/cuda/runtime.h has the compute and
// communication streams). Include only from */cuda/*.cu files or behind PRECIS_WITH_CUDA.
//
// A convolution's weight gradient is such work (ops/conv.cpp, set_conv_wgrad_stream): nothing
// but the optimizer reads it, so it may run while the compute stream goes on with the
// backward's memory-bound kernels. A residual block's downsample shortcut is another
// (models/resnet.cpp, set_shortcut_stream): its forward, and optionally its autograd nodes'
// backward (SideStreamScope::Backward). SideStreamScope forks: the side stream waits for the work
// queued on the compute stream so far, and until the scope ends compute_stream(device) is the
// side stream on this thread (PyTorch's "current stream"), so the kernels, cuDNN calls and
// allocations made inside the scope go there unchanged. join_side_streams() makes each
// compute stream wait for what its side stream has queued; autograd's backward() calls it
// before anything else touches a gradient written there, and at its end (core/autograd.h).
//
// Memory. A tensor made on the compute stream, read inside the scope and freed before the
// join must be record_stream'ed to the side stream (core/cuda/caching_allocator.h): the
// caching allocator would otherwise hand its block to the compute stream at once. Blocks
// allocated inside the scope belong to the side stream's pool: when the compute stream reads one
// and the host frees it, the pool hands it out again only to side-stream work, which a fork made
// after the free orders after those reads (see fork_side_stream for the one exception).
//
// CUDA graphs. The fork's event pulls the side stream into a capture of the compute stream;
// the join must come before the capture ends (the end of backward() does it).
//
// Priority. With PRECIS_EXP_SIDE_STREAM_LOW_PRIORITY=1 (read once, when the streams are made)
// the compute and communication streams get the device's greatest priority and the side stream
// the least (the default), so that the block scheduler prefers the compute stream's blocks:
// the critical path's. Unset, every stream has the default priority.
#pragma once

#include <cuda_runtime.h>

#include "core/device.h"

namespace precis::cuda {

// The side stream of `device` (made with its compute stream).
cudaStream_t side_stream(Device device);

// Makes the side stream of `device` wait for the work queued on its compute stream so far: the
// fork a SideStreamScope makes when it starts, made ahead of it. A scope opened later with
// Fork::made queues its work behind this fork only, so that it runs beside whatever the compute
// stream is given in between, though queued after it (a residual block's shortcut, queued after
// the main branch so that autograd records the block's nodes in their usual order:
// models/resnet.cpp). Until then nothing may free a block of the side stream's pool that the
// compute stream reads after the fork (the scope's allocations may take it). Counts as work to
// join.
void fork_side_stream(Device device);

// Forks the side stream of `device` from its compute stream and makes it this thread's
// compute_stream(device) until the scope ends. Nests (an inner scope forks nothing). With
// Fork::made, forks nothing either: fork_side_stream(device) has. With Backward::on_side_stream
// the autograd nodes recorded inside the scope run their backward on the side stream too
// (core/autograd.cpp, "Backward on the side stream"); an inner scope keeps the outer's choice.
class SideStreamScope {
 public:
  enum class Fork { now, made };
  enum class Backward { on_compute_stream, on_side_stream };
  explicit SideStreamScope(Device device, Fork fork = Fork::now, Backward backward = Backward::on_compute_stream);
  ~SideStreamScope();
  SideStreamScope(const SideStreamScope&) = delete;
  SideStreamScope& operator=(const SideStreamScope&) = delete;

 private:
  cudaStream_t previous_stream_;
  int previous_device_;
  int previous_backward_device_;
};

// A point of a device's side stream: the work queued there when mark_side_stream was called
// (an event of a ring of kSideStreamPoints per device). device -1: no point.
inline constexpr int kSideStreamPoints = 64;
struct SideStreamPoint {
  int device = -1;
  int slot = 0;
};
// Marks the side stream of `device` where its queued work ends now.
SideStreamPoint mark_side_stream(Device device);
// Makes the compute stream of the point's device wait for the side stream's work up to the point:
// a join for part of it (the work queued after the point may still run beside). Once the ring has
// come round, the event marks a later point: the wait is longer, never too short. Nothing for
// device -1.
void wait_for_side_stream(SideStreamPoint point);

// The device whose side stream this thread's SideStreamScope asked the backward of the nodes
// recorded inside it to run on (Backward::on_side_stream), or -1.
int side_stream_backward_device();

// Makes every compute stream whose side stream has work queued since the last join wait for
// that work. Costs one atomic load when there is none.
void join_side_streams();
// The same for `device` only (a residual block's shortcut, models/resnet.cpp: the block joins
// its own device's streams before it adds the shortcut). Nothing when its side stream has had
// no scope since the last join.
void join_side_stream(Device device);

}  // namespace precis::cuda
