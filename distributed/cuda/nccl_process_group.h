// The NCCL backend of ProcessGroup: tensors on this rank's GPU, one rank per process.
//
// Collectives run on the device's communication stream (core/cuda/runtime.h):
// each waits (an event) for what is queued on the compute stream when it is
// called, and its Work::wait() makes the compute stream wait for it. The tensors'
// blocks are marked as used by the communication stream (record_stream), so
// freeing one before the collective completes is safe. The communicator is made
// on the first collective (ncclCommInitRank), after `share_unique_id` has given
// every rank rank 0's ncclUniqueId: through MPI under mpirun/srun, through the TCP
// rendezvous under torchrun-style variables (distributed/launch.h picks). Every
// NCCL call is checked and its error names the collective, NCCL's message and
// ncclGetLastError's detail; check_async_error() asks ncclCommGetAsyncError, and
// synchronize() polls it while it waits for the device (and so does every other host wait
// of the thread that made the group, an eager step's index check or a loss read back:
// cuda::WaitWatcher, core/cuda/runtime.h), aborting the communicator
// after `timeout` (zero: never) so that a dead or hung peer ends the run with an error:
// the watchdog's (watchdog.h), which names the last collective queued and its sequence
// number and, where MPI is initialized (an mpirun/srun launch without MASTER_ADDR),
// asks the other ranks over MPI within `answer_grace` to name the missing one. A
// constructor with a timeout is then collective over MPI_COMM_WORLD.
//
// Declared without CUDA headers; in a build without CUDA, making one throws.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "distributed/process_group.h"
#include "distributed/watchdog.h"

namespace precis::distributed {

// Replaces `bytes` by rank 0's bytes (same size on every rank): a broadcast from rank 0.
using ShareBytes = std::function<void(std::vector<uint8_t>& bytes)>;

// `device` is this rank's GPU. Nothing is communicated until the first collective.
std::shared_ptr<ProcessGroup> make_nccl_process_group(int rank, int world_size, Device device,
                                                      ShareBytes share_unique_id,
                                                      std::chrono::milliseconds timeout = {},
                                                      std::chrono::milliseconds answer_grace = kPeerAnswerGrace);

}  // namespace precis::distributed
