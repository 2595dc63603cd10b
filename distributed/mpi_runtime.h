// MPI itself: initialization, finalization and the byte broadcast the NCCL
// backend bootstraps with under mpirun/srun. Declared without mpi.h, so any file
// may call them; in a build without MPI (PRECIS_WITH_MPI off) each one that needs
// MPI throws a precis::Error saying so.
#pragma once

#include <cstddef>

namespace precis::distributed {

// Whether this build links MPI.
bool built_with_mpi();
// MPI_Init_thread (MPI_THREAD_FUNNELED: MPI is only ever called from the thread
// that drives training) unless MPI is initialized already; MPI_Finalize then runs
// at exit. Errors on MPI_COMM_WORLD are returned, not fatal, so they become
// precis::Errors naming the call.
void init_mpi();
// MPI_Finalize, if init_mpi() initialized MPI and it is not finalized yet. A collective
// given up on after a timeout (mpi_check.h's wait_with_timeout) that has still not
// completed after a few seconds means a peer is gone: MPI_Finalize would wait for it
// forever, so the job is aborted instead (MPI_Abort: mpirun ends every rank). So it is after
// the NCCL backend gave up on a collective (note_collective_given_up).
void finalize_mpi();
// Ends every rank of the job now (MPI_Abort on MPI_COMM_WORLD, which mpirun and srun turn into
// the end of every process), for a rank that failed with an error it has printed: otherwise the
// other ranks would wait for it in their collectives until distributed.timeout_s (minutes), and
// this rank in MPI_Finalize with them. Only where init_mpi initialized MPI, it is not finalized
// and the world has more than one rank; otherwise (and in a build without MPI) it returns.
void abort_job_after_error(int exit_code);
// Marks that this process gave up on an NCCL collective after its timeout (the fault
// watchdog's error, distributed/watchdog.h). At exit MPI_Finalize would wait for every rank,
// and a rank that hangs never comes; NCCL leaves no MPI request behind to show it (the MPI
// backend's abandoned requests do). So finalize_mpi aborts the job instead. Any build
// (without MPI: only remembered).
void note_collective_given_up();
bool collective_given_up();
// Forgets the mark, for a caller that has since seen every rank answer (a test that provoked
// the timeout, then met all ranks at a barrier): MPI_Finalize will not wait forever then.
void clear_collective_given_up();
// This process's rank and the number of processes in MPI_COMM_WORLD (after init_mpi).
int mpi_world_rank();
int mpi_world_size();
// `bytes` bytes at `data` <- rank `root`'s (MPI_Bcast on MPI_COMM_WORLD).
void mpi_broadcast_bytes(void* data, size_t bytes, int root);

}  // namespace precis::distributed
