// GPU memory NCCL reads and writes in place: NCCL's user buffer registration.
//
// A collective on ordinary (cudaMalloc) memory moves its bytes through NCCL's own
// staging buffers: a ring all-gather's kernels copy each chunk from the sender's
// buffer into a staging slot of the receiver and from there into the receiver's
// output. Memory from ncclMemAlloc (CUDA's virtual memory API, shareable between
// processes) that is registered with a communicator (ncclCommRegister) lets NCCL
// map the peers' buffers and copy straight from one user buffer into the other:
// fewer bytes through the SMs, fewer channels. NCCL uses a registration where its
// algorithm can (in NCCL 2.28: the ring all-gather and all-reduces that are not in
// place, not the ring reduce-scatter), and every rank of the communicator must pass
// registered buffers to the same collective, which holds here since every rank
// allocates the same buffers. bench/NOTES.md (tenth session) has the measurements.
//
// RegisteredAllocator gives such memory, one ncclMemAlloc and one registration per
// allocation (it is for a few large buffers made once, the flat parameter buffer that
// ZeRO-1 all-gathers every step; there is no cache). Freeing one waits for the device
// first, where the caching allocator tracks the streams that use a block (record_stream):
// for buffers freed once, at the end of a run, the wait costs nothing. Its storages share its ownership
// (core/storage.h), so it outlives them; the communicator may not: the process group
// calls detach() before destroying or aborting it, and a buffer freed later only returns
// its memory. Include only from files built with
// PRECIS_WITH_CUDA (it includes nccl.h).
//
// (The eleventh session tried symmetric windows instead, ncclCommWindowRegister, for NCCL's
// copy-engine all-gather: slower in the step; bench/NOTES.md.) A buffer is also registered as
// a symmetric window on demand (window(): ZeRO-1's fused gather stores into the peers' copies
// through it, distributed/cuda/peer_memory.h); the window goes with the buffer.
#pragma once

#include <nccl.h>

#include <map>
#include <mutex>

#include "core/allocator.h"

namespace precis::distributed {

class RegisteredAllocator final : public Allocator {
 public:
  // For buffers on `device` used by the collectives of `comm` (made already).
  RegisteredAllocator(Device device, ncclComm_t comm) : device_(device), comm_(comm) {}
  void* allocate(size_t nbytes) override;
  void deallocate(void* ptr, size_t nbytes) override;
  Device device() const override { return device_; }
  AllocatorStats stats() const override;
  void reset_peak() override;
  // Whether `base` is an allocation of this allocator's (a storage's data pointer).
  bool owns(const void* base) const;
  // The allocation at `base` registered as an NCCL symmetric window (NCCL_WIN_COLL_SYMMETRIC),
  // made on the first call: a collective, every rank asking for its buffer of the same
  // allocation in the same order.
  ncclWindow_t window(const void* base);
  // The communicator is about to be destroyed (deregister: every live buffer's registration
  // first) or aborted (not: the abort releases them); later buffers cannot be allocated.
  void detach(bool deregister);

 private:
  Device device_;
  mutable std::mutex mutex_;
  ncclComm_t comm_;                              // null once detached
  std::map<const void*, void*> handles_;         // live buffer -> its registration handle (null once detached)
  std::map<const void*, size_t> sizes_;          // live buffer -> its bytes
  std::map<const void*, ncclWindow_t> windows_;  // buffers registered as windows too
  size_t allocated_ = 0, peak_ = 0, allocs_ = 0, frees_ = 0;
};

}  // namespace precis::distributed
