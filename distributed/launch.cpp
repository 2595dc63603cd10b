#include "distributed/launch.h"

#include <cerrno>
#include <cstdlib>
#include <optional>

#include "core/error.h"
#include "distributed/cuda/nccl_process_group.h"
#include "distributed/mpi_process_group.h"
#include "distributed/mpi_runtime.h"
#include "distributed/tcp_rendezvous.h"

namespace precis::distributed {

const char* launcher_name(Launcher launcher) {
  switch (launcher) {
    case Launcher::none:
      return "none";
    case Launcher::mpirun:
      return "mpirun";
    case Launcher::pmi:
      return "pmi";
    case Launcher::slurm:
      return "srun";
    case Launcher::torchrun:
      return "torchrun-style";
  }
  return "?";
}

namespace {

// The integer value of `name`, if set; a value that is not an integer is an error.
std::optional<int> read_int(const EnvLookup& env, const char* name) {
  const char* text = env(name);
  if (!text) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  long value = std::strtol(text, &end, 10);
  PRECIS_CHECK(*text != '\0' && *end == '\0' && errno == 0 && value >= 0 && value <= 1 << 30, "launch: ", name, "=",
               text, " is not a non-negative integer");
  return static_cast<int>(value);
}

// Rank and world size from a pair of variables both set (or neither: nullopt).
struct RankAndSize {
  int rank, world_size;
};
std::optional<RankAndSize> read_pair(const EnvLookup& env, const char* rank_name, const char* size_name) {
  std::optional<int> rank = read_int(env, rank_name), size = read_int(env, size_name);
  if (!rank && !size) return std::nullopt;
  PRECIS_CHECK(rank && size, "launch: ", rank ? rank_name : size_name, " is set but ", rank ? size_name : rank_name,
               " is not; set both or neither");
  return RankAndSize{*rank, *size};
}

void check_rank(const LaunchInfo& info, const char* rank_name, const char* size_name) {
  PRECIS_CHECK(info.world_size >= 1, "launch: ", size_name, "=", info.world_size, " must be at least 1");
  PRECIS_CHECK(info.rank < info.world_size, "launch: ", rank_name, "=", info.rank, " must be below ", size_name, "=",
               info.world_size);
  PRECIS_CHECK(info.local_rank < info.world_size, "launch: the local rank ", info.local_rank,
               " must be below the world size ", info.world_size);
}

}  // namespace

LaunchInfo detect_launch(const EnvLookup& env) {
  LaunchInfo info;
  if (const char* addr = env("MASTER_ADDR")) info.master_addr = addr;
  if (std::optional<int> port = read_int(env, "MASTER_PORT")) {
    PRECIS_CHECK(*port >= 1 && *port <= 65535, "launch: MASTER_PORT=", *port, " is not a TCP port (1..65535)");
    info.master_port = *port;
  }
  std::optional<RankAndSize> torchrun = read_pair(env, "RANK", "WORLD_SIZE");
  std::optional<int> local_rank = read_int(env, "LOCAL_RANK");
  const char* rank_name = "RANK";
  const char* size_name = "WORLD_SIZE";

  std::optional<RankAndSize> launched;
  if ((launched = read_pair(env, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"))) {
    info.launcher = Launcher::mpirun;
    rank_name = "OMPI_COMM_WORLD_RANK", size_name = "OMPI_COMM_WORLD_SIZE";
    if (std::optional<int> local = read_int(env, "OMPI_COMM_WORLD_LOCAL_RANK")) local_rank = local;
  } else if ((launched = read_pair(env, "PMI_RANK", "PMI_SIZE"))) {
    info.launcher = Launcher::pmi;
    rank_name = "PMI_RANK", size_name = "PMI_SIZE";
    if (std::optional<int> local = read_int(env, "MPI_LOCALRANKID")) local_rank = local;
  } else if (torchrun) {
    // Before srun's: torchrun may run inside srun (one task per node), its processes being the ranks.
    info.launcher = Launcher::torchrun;
    launched = torchrun;
  } else if (env("SLURM_STEP_ID") && (launched = read_pair(env, "SLURM_PROCID", "SLURM_NTASKS"))) {
    info.launcher = Launcher::slurm;
    rank_name = "SLURM_PROCID", size_name = "SLURM_NTASKS";
    if (std::optional<int> local = read_int(env, "SLURM_LOCALID")) local_rank = local;
  }
  if (!launched) return info;  // one process

  info.rank = launched->rank;
  info.world_size = launched->world_size;
  if (info.launcher != Launcher::torchrun && torchrun) {
    PRECIS_CHECK(torchrun->rank == info.rank && torchrun->world_size == info.world_size,
                 "launch: RANK=", torchrun->rank, " WORLD_SIZE=", torchrun->world_size, " disagree with the ",
                 launcher_name(info.launcher), " launcher's ", rank_name, "=", info.rank, " ", size_name, "=",
                 info.world_size, "; unset RANK and WORLD_SIZE");
  }
  if (info.world_size > 1) {
    PRECIS_CHECK(local_rank, "launch: the ", launcher_name(info.launcher),
                 " launch sets no local rank (which GPU this process takes); set LOCAL_RANK");
  }
  info.local_rank = local_rank.value_or(0);
  check_rank(info, rank_name, size_name);
  if (info.launcher == Launcher::torchrun && info.world_size > 1) {
    PRECIS_CHECK(info.has_master_endpoint(), "launch: RANK/WORLD_SIZE describe a world of ", info.world_size,
                 " processes but ", info.master_addr.empty() ? "MASTER_ADDR" : "MASTER_PORT",
                 " is not set: set MASTER_ADDR and MASTER_PORT to rank 0's host and a free port");
  }
  return info;
}

LaunchInfo detect_launch() {
  return detect_launch([](const char* name) -> const char* { return std::getenv(name); });
}

const char* backend_name(Backend backend) {
  switch (backend) {
    case Backend::auto_select:
      return "auto";
    case Backend::nccl:
      return "nccl";
    case Backend::mpi:
      return "mpi";
  }
  return "?";
}

Backend parse_backend(const std::string& text) {
  if (text == "auto") return Backend::auto_select;
  if (text == "nccl") return Backend::nccl;
  if (text == "mpi") return Backend::mpi;
  PRECIS_FAIL("distributed.backend: unknown backend '", text, "' (auto, nccl or mpi)");
}

Backend resolve_backend(Backend backend, Device device) {
  if (backend == Backend::auto_select) return device.is_cuda() ? Backend::nccl : Backend::mpi;
  PRECIS_CHECK(backend != Backend::nccl || device.is_cuda(),
               "distributed.backend: nccl reduces GPU tensors but this run is on the CPU; use mpi (or auto)");
  PRECIS_CHECK(backend != Backend::mpi || device.is_cpu(),
               "distributed.backend: mpi reduces CPU tensors but this run is on ", device, "; use nccl (or auto)");
  return backend;
}

Device rank_device(const LaunchInfo& launch, Device device) {
  return device.is_cuda() ? Device::cuda(launch.local_rank) : Device::cpu();
}

namespace {

// MPI must see the world the launcher described (an MPI without the launcher's
// process-management support starts every process as a world of one).
void check_mpi_world(const LaunchInfo& launch) {
  const int rank = mpi_world_rank(), size = mpi_world_size();
  PRECIS_CHECK(rank == launch.rank && size == launch.world_size, "launch: MPI sees rank ", rank, " of ", size,
               " but the ", launcher_name(launch.launcher), " launcher says rank ", launch.rank, " of ",
               launch.world_size, "; this MPI cannot talk to that launcher (under srun try --mpi=pmix, or use mpirun)");
}

}  // namespace

std::shared_ptr<ProcessGroup> init_process_group(const LaunchInfo& launch, Backend backend, Device device,
                                                 const ProcessGroupOptions& options) {
  backend = resolve_backend(backend, device);
  if (backend == Backend::mpi) {
    PRECIS_CHECK(launch.launched_by_mpi() || !launch.distributed(), "distributed.backend: mpi needs an MPI launcher ",
                 "(mpirun or srun), but this ", launcher_name(launch.launcher),
                 " launch started the processes; launch with mpirun -np N, or run on GPUs with nccl");
    init_mpi();
    if (launch.launched_by_mpi()) check_mpi_world(launch);
    return make_mpi_process_group(options.collective_timeout);
  }
  // NCCL needs MPI only to share its unique id, and not where MASTER_ADDR/MASTER_PORT are set.
  if (launch.launched_by_mpi() && !launch.has_master_endpoint()) {
    init_mpi();
    check_mpi_world(launch);
  }
  ShareBytes share;
  if (!launch.distributed()) {
    share = [](std::vector<uint8_t>&) {};
  } else if (launch.has_master_endpoint()) {
    const TcpEndpoint endpoint{launch.master_addr, launch.master_port};
    const int rank = launch.rank, world_size = launch.world_size;
    const auto timeout = options.rendezvous_timeout;
    share = [endpoint, rank, world_size, timeout](std::vector<uint8_t>& bytes) {
      bytes = tcp_broadcast_bytes(endpoint, rank, world_size, bytes, timeout);
    };
  } else {
    share = [](std::vector<uint8_t>& bytes) { mpi_broadcast_bytes(bytes.data(), bytes.size(), 0); };
  }
  return make_nccl_process_group(launch.rank, launch.world_size, device, std::move(share), options.collective_timeout);
}

}  // namespace precis::distributed
