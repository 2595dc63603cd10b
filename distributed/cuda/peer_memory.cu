// NCCL's symmetric memory and its LSA barrier (distributed/cuda/peer_memory.h).
#include <nccl_device.h>

#include <cstring>

#include "core/cuda/launch.cuh"
#include "core/cuda/wait_watch.h"
#include "distributed/cuda/nccl_check.h"
#include "distributed/cuda/peer_memory.h"

namespace precis::distributed {

namespace {

// out[r] <- where the window's byte 0 is in rank r's copy (NCCL's flat mapping of its LSA team).
__global__ void peer_pointers_kernel(ncclWindow_t window, int world_size, uint64_t* out) {
  precis::cuda::wait_for_previous_grid();
  precis::cuda::allow_next_grid_to_start();
  for (int r = static_cast<int>(threadIdx.x); r < world_size; r += static_cast<int>(blockDim.x))
    out[r] = reinterpret_cast<uint64_t>(ncclGetPeerPointer(window, 0, r));
}

// Every rank's block meets every other's: its arrival releases what this rank stored before it
// (the kernels before it on the stream), its wait acquires what the others stored before theirs.
// The wait is NCCL's (ncclLsaBarrierSession::wait: one thread a peer reads the inbox that peer
// stores its epoch into, until the epoch is this barrier's), written out here so that it also
// reads `aborted`, which NCCL's never gives up: set by the host when the watchdog ends the run
// (PeerMemory::abort), it lets the kernel return where a dead peer never arrives, so that the
// work queued behind it, the communicator's abort and the process' exit do not wait forever.
// No early start for the next kernel: it would only park on its own wait.
__global__ void lsa_barrier_kernel(ncclDevComm comm, const volatile uint32_t* aborted) {
  precis::cuda::wait_for_previous_grid();
  ncclLsaBarrierSession<ncclCoopCta> barrier(ncclCoopCta(), comm, ncclTeamTagLsa(), 0);
  barrier.arrive(ncclCoopCta(), ::cuda::memory_order_acq_rel);
  const ncclTeam team = barrier.team;
  for (int i = static_cast<int>(threadIdx.x); i < team.nRanks - 1; i += static_cast<int>(blockDim.x)) {
    const int peer = i + (team.rank <= i ? 1 : 0);
    ::cuda::atomic_ref<uint32_t> inbox(*barrier.ucInbox(team.rank, peer));
    // Arrived: the peer's epoch is at least ours + 1 (in the modular order NCCL's wait uses).
    for (uint32_t polls = 1;; ++polls) {
      if (inbox.load(::cuda::memory_order_acquire) - (barrier.epoch + 1) <= UINT32_MAX >> 1) break;
      if (polls % 1024 == 0 && *aborted != 0) break;  // a read of host memory every ~1k polls
    }
  }
  barrier.epoch += 1;  // the session's destructor keeps it for the next barrier
  __syncthreads();
}
}  // namespace

PeerMemory::PeerMemory(ncclComm_t comm, Device device, int world_size)
    : comm_(comm), device_(device), world_size_(world_size), dev_comm_(std::make_unique<ncclDevComm>()) {}

std::unique_ptr<PeerMemory> PeerMemory::make(ncclComm_t comm, Device device, int world_size, std::string& why) {
  // The team size is a property of the communicator, the same on every rank: all return here, or none.
  const ncclTeam_t lsa = ncclTeamLsa(comm);
  if (lsa.nRanks != world_size) {
    why = "only " + std::to_string(lsa.nRanks) + " of the " + std::to_string(world_size) +
          " ranks' GPUs can store into each other's memory (NCCL's LSA team: one NVLink node)";
    return nullptr;
  }
  cuda::DeviceGuard guard(device);
  std::unique_ptr<PeerMemory> peers(new PeerMemory(comm, device, world_size));
  ncclDevCommRequirements requirements;
  std::memset(&requirements, 0, sizeof requirements);
  requirements.lsaBarrierCount = 1;  // barrier(): one block
  PRECIS_NCCL_CHECK(ncclDevCommCreate(comm, &requirements, peers->dev_comm_.get()), "peer memory: ncclDevCommCreate");
  // The abort flag: host memory the barrier kernels read, at its mapped device address.
  void* flag = nullptr;
  PRECIS_CUDA_CHECK(cudaHostAlloc(&flag, sizeof(uint32_t), cudaHostAllocMapped), "peer memory: the abort flag");
  peers->aborted_ = static_cast<volatile uint32_t*>(flag);
  *peers->aborted_ = 0;
  void* on_device = nullptr;
  PRECIS_CUDA_CHECK(cudaHostGetDevicePointer(&on_device, flag, 0), "peer memory: the abort flag");
  peers->aborted_on_device_ = static_cast<const volatile uint32_t*>(on_device);
  return peers;
}

PeerMemory::~PeerMemory() {
  // After abort() a barrier kernel may still be reading the flag on its way out: it stays (4 bytes,
  // in a process that is ending).
  if (aborted_ && *aborted_ == 0) cudaFreeHost(const_cast<uint32_t*>(aborted_));
}

void PeerMemory::abort() {
  if (aborted_) *aborted_ = 1;
}

std::vector<int64_t> PeerMemory::offsets(ncclWindow_t window, const void* local) const {
  PRECIS_CHECK(dev_comm_, "peer memory: used after release()");
  cuda::DeviceGuard guard(device_);
  cudaStream_t stream = cuda::compute_stream(device_);
  uint64_t* pointers = nullptr;
  PRECIS_CUDA_CHECK(cudaMallocAsync(&pointers, sizeof(uint64_t) * world_size_, stream), "peer memory");
  precis::cuda::launch(peer_pointers_kernel, 1, 32, 0, stream, window, world_size_, pointers);
  PRECIS_CUDA_CHECK_LAUNCH("peer memory");
  std::vector<uint64_t> host(world_size_);
  PRECIS_CUDA_CHECK(
      cudaMemcpyAsync(host.data(), pointers, sizeof(uint64_t) * world_size_, cudaMemcpyDeviceToHost, stream),
      "peer memory");
  PRECIS_CUDA_CHECK(cudaFreeAsync(pointers, stream), "peer memory");
  cuda::synchronize_stream(stream, "peer memory");
  // NCCL maps this rank's copy a second time among the others: byte 0 of the window is
  // `local` in this process's own mapping, host[rank] in NCCL's.
  int rank = -1;
  PRECIS_NCCL_CHECK(ncclCommUserRank(comm_, &rank), "peer memory");
  std::vector<int64_t> out(world_size_);
  for (int r = 0; r < world_size_; ++r)
    out[r] = r == rank ? 0 : static_cast<int64_t>(host[r]) - static_cast<int64_t>(reinterpret_cast<uintptr_t>(local));
  return out;
}

void PeerMemory::barrier(cudaStream_t stream) const {
  PRECIS_CHECK(dev_comm_, "peer memory: used after release()");
  cuda::DeviceGuard guard(device_);
  precis::cuda::launch(lsa_barrier_kernel, 1, 32, 0, stream, *dev_comm_, aborted_on_device_);
  PRECIS_CUDA_CHECK_LAUNCH("peer memory barrier");
}

void PeerMemory::release() {
  if (!dev_comm_) return;
  cuda::DeviceGuard guard(device_);
  ncclDevCommDestroy(comm_, dev_comm_.get());  // no throwing: called on the way out
  dev_comm_.reset();
}

}  // namespace precis::distributed
