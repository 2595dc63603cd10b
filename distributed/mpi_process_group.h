// The MPI backend of ProcessGroup: CPU tensors, over a duplicate of
// MPI_COMM_WORLD, with nonblocking collectives (MPI_Iallreduce, ...) whose
// Work::wait() is MPI_Wait. It is how data parallelism runs and is tested on
// CPU-only machines (`mpirun -np 2 ...`).
//
// MPI has no bf16 or f16 type. Sums of them use a 2-byte MPI datatype per format
// and a custom commutative MPI_Op that widens each pair to f32, adds, and rounds
// back to the format (round to nearest even), rather than widening the whole
// buffer to f32, summing and narrowing once: the bytes on the wire stay 2 per
// element (halving traffic is why one reduces in 16 bits at all), and every
// partial sum is rounded as NCCL rounds it on the GPU, so the two backends agree.
#pragma once

#include <chrono>
#include <memory>

#include "distributed/process_group.h"
#include "distributed/watchdog.h"

namespace precis::distributed {

// A process group of every process of MPI_COMM_WORLD (calls init_mpi). Collective:
// every rank must call it. Throws in a build without MPI. With a `timeout` (> 0), a
// collective whose wait() (or barrier()) lasts longer fails with the watchdog's error
// (watchdog.h): this rank, the collective and its sequence number, and, from the
// answers the other ranks give within `answer_grace`, which rank is missing.
std::shared_ptr<ProcessGroup> make_mpi_process_group(std::chrono::milliseconds timeout = {},
                                                     std::chrono::milliseconds answer_grace = kPeerAnswerGrace);

}  // namespace precis::distributed
