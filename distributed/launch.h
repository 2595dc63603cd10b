// Who am I: this process's rank, the world size and its local rank (which GPU it
// takes), read from the variables the launcher set, and the process group of the run.
//
//   mpirun (OpenMPI)      OMPI_COMM_WORLD_RANK / _SIZE / _LOCAL_RANK
//   MPICH / Intel MPI     PMI_RANK / PMI_SIZE, local rank MPI_LOCALRANKID (or LOCAL_RANK)
//   torchrun-style        RANK / WORLD_SIZE / LOCAL_RANK with MASTER_ADDR / MASTER_PORT
//   srun (Slurm)          SLURM_PROCID / SLURM_NTASKS / SLURM_LOCALID, when SLURM_STEP_ID says
//                         srun started the process (an sbatch script alone sets the others too)
//   none of these         one process: rank 0 of 1
//
// The first of these that is set is the launcher (torchrun before srun: torchrun
// may run inside srun, one task per node); RANK/WORLD_SIZE, if also set under an
// MPI launcher, must agree with it. MASTER_ADDR/MASTER_PORT, where set, are read under any
// launcher: the NCCL backend then shares its unique id over TCP instead of MPI.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "core/device.h"
#include "distributed/process_group.h"

namespace precis::distributed {

enum class Launcher { none, mpirun, pmi, slurm, torchrun };
const char* launcher_name(Launcher launcher);

struct LaunchInfo {
  Launcher launcher = Launcher::none;
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  std::string master_addr;  // empty unless MASTER_ADDR is set
  int master_port = 0;      // 0 unless MASTER_PORT is set

  bool distributed() const { return world_size > 1; }
  // Started by an MPI launcher (mpirun, an MPI's hydra, srun): MPI_Init finds the world.
  bool launched_by_mpi() const {
    return launcher == Launcher::mpirun || launcher == Launcher::pmi || launcher == Launcher::slurm;
  }
  bool has_master_endpoint() const { return !master_addr.empty() && master_port > 0; }
};

// The value of an environment variable, or null when it is unset.
using EnvLookup = std::function<const char*(const char* name)>;
// Reads the variables above through `env`. Inconsistent settings (RANK >= WORLD_SIZE,
// RANK without WORLD_SIZE, a torchrun-style world without MASTER_ADDR, a value that is
// not a number, ...) are a precis::Error naming the variables.
LaunchInfo detect_launch(const EnvLookup& env);
// detect_launch over this process's environment.
LaunchInfo detect_launch();

enum class Backend { auto_select, nccl, mpi };
const char* backend_name(Backend backend);
// "auto", "nccl" or "mpi" (the YAML's distributed.backend).
Backend parse_backend(const std::string& text);
// auto becomes nccl for a GPU run and mpi for a CPU run; nccl on the CPU or mpi on
// a GPU is an error (the MPI backend reduces CPU tensors only).
Backend resolve_backend(Backend backend, Device device);
// The device of this rank for a run configured on `device`: cuda:local_rank for a GPU
// run (each rank takes its own GPU; the index in `device` is ignored), the CPU otherwise.
Device rank_device(const LaunchInfo& launch, Device device);

struct ProcessGroupOptions {
  // How long the TCP rendezvous waits for every rank to arrive.
  std::chrono::milliseconds rendezvous_timeout = std::chrono::minutes(5);
  // How long a collective may wait for the other ranks before it fails (MPI: its wait();
  // NCCL: the group's synchronize()); zero: forever.
  std::chrono::milliseconds collective_timeout{0};
};

// The process group of this run, for tensors on `device` (rank_device's answer).
// MPI is initialized only where it is needed: for the mpi backend, and for the
// NCCL unique id, which goes through TCP where MASTER_ADDR/MASTER_PORT are set and
// through MPI otherwise (under an MPI launcher). Errors name what to change (a build
// without MPI or CUDA, the mpi backend under a torchrun-style launch, MPI seeing
// another world than the launcher's).
std::shared_ptr<ProcessGroup> init_process_group(const LaunchInfo& launch, Backend backend, Device device,
                                                 const ProcessGroupOptions& options = {});

}  // namespace precis::distributed
