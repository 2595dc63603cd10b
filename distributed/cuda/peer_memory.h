// Stores into the other ranks' GPU memory: NCCL's symmetric memory and device API (NCCL 2.28).
//
// On GPUs that load and store to each other's memory (one NVLink node: NCCL's "LSA team" is
// every rank), a buffer registered as a symmetric window (RegisteredAllocator::window) is
// mapped by NCCL into every rank's address space, each rank's copy at its own place. A kernel
// of ours may then write the same bytes into every rank's copy as it writes its own, where an
// all-gather would copy them afterwards: ZeRO-1's optimizer does (distributed/zero.h, "fused
// gather"), and `barrier()` is what makes those stores safe to read on the other side.
//
// offsets(window, local): where the window's bytes are in rank r's copy, as a byte offset
// from this rank's address `local` of them (ncclGetPeerPointer on the device, read back once).
// barrier(stream): a one-block kernel queued on `stream`, NCCL's LSA barrier with acquire and
// release order: it returns on every rank once every rank has reached it, and each rank's
// stores from before its barrier (the kernels queued before it on its stream) are visible to
// the work every other rank queues after its own. It waits for the kernel before it (PDL)
// and does not let the next start early.
//
// abort(): a rank that dies never arrives at a barrier, and its peers' barrier kernels would
// wait for it forever (and the work queued behind them, the communicator's abort, the process'
// exit with them): when the fault watchdog (watchdog.h) ends the run, abort() makes every
// barrier kernel of this rank return at once, waiting or not. The run cannot go on after it.
// Include only from files built with PRECIS_WITH_CUDA.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/device.h"

struct ncclDevComm;

namespace precis::distributed {

class PeerMemory {
 public:
  // A collective over `comm` (every rank, on its GPU `device`): null, with `why` saying so,
  // where the ranks cannot store into each other's memory.
  static std::unique_ptr<PeerMemory> make(ncclComm_t comm, Device device, int world_size, std::string& why);
  ~PeerMemory();
  PeerMemory(const PeerMemory&) = delete;
  PeerMemory& operator=(const PeerMemory&) = delete;

  // Rank r's copy of the window's bytes is at (char*)local + offsets[r] (offsets[rank] is 0).
  std::vector<int64_t> offsets(ncclWindow_t window, const void* local) const;
  void barrier(cudaStream_t stream) const;
  // The run is failing (a peer died or hangs): the barriers stop waiting. From the host, at once.
  void abort();
  // Before the communicator is destroyed (collective): frees what make() asked NCCL for.
  void release();

 private:
  PeerMemory(ncclComm_t comm, Device device, int world_size);

  ncclComm_t comm_;
  Device device_;
  int world_size_;
  std::unique_ptr<ncclDevComm> dev_comm_;                 // null once released
  volatile uint32_t* aborted_ = nullptr;                  // mapped host memory: nonzero after abort()
  const volatile uint32_t* aborted_on_device_ = nullptr;  // its address in the barrier kernels
};

}  // namespace precis::distributed
