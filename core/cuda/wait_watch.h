// Host waits for the device that a data-parallel run's fault watchdog can end.
//
// A step's host waits (an eager step's index check reading back its flag, a loss copied
// back) can sit behind a collective that never completes, because a peer died or hangs. While
// a watcher is set (the NCCL process group sets itself: distributed/cuda/nccl_process_group.cpp),
// synchronize_stream() and cuda::synchronize() poll the stream instead of blocking in the
// driver, and call the watcher's waited() with the time waited so far, every ~0.05 ms after a
// first millisecond of spinning; waited() throws to end the wait (the watchdog's error).
// Without a watcher they are cudaStreamSynchronize. Include behind PRECIS_WITH_CUDA.
#pragma once

#include <cuda_runtime.h>

#include <chrono>

namespace precis::cuda {

class WaitWatcher {
 public:
  virtual ~WaitWatcher() = default;
  virtual void waited(std::chrono::steady_clock::duration so_far) = 0;
};

// Sets the process' watcher (null: none); returns the one it replaces.
WaitWatcher* set_wait_watcher(WaitWatcher* watcher);
// Takes `watcher` away if it is the one set, putting `previous` back.
void clear_wait_watcher(WaitWatcher* watcher, WaitWatcher* previous);

// Waits for everything queued on `stream`, watched; `op` names the wait in an error.
void synchronize_stream(cudaStream_t stream, const char* op);

}  // namespace precis::cuda
