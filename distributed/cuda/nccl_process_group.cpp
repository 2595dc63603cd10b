#include "distributed/cuda/nccl_process_group.h"

#if PRECIS_WITH_CUDA

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "core/cuda/caching_allocator.h"
#include "core/cuda/runtime.h"
#include "core/cuda/wait_watch.h"
#include "core/gpu.h"
#include "distributed/cuda/nccl_check.h"
#include "distributed/cuda/peer_memory.h"
#include "distributed/cuda/registered_memory.h"
#include "distributed/mpi_runtime.h"
#include "distributed/watchdog.h"

namespace precis::distributed {

namespace {

ncclDataType_t nccl_type(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return ncclFloat32;
    case DType::f64:
      return ncclFloat64;
    case DType::f16:
      return ncclFloat16;
    case DType::bf16:
      return ncclBfloat16;
    case DType::i32:
      return ncclInt32;
    case DType::i64:
      return ncclInt64;
    default:
      PRECIS_FAIL("nccl: unsupported dtype ", dtype);
  }
}

// ncclAvg multiplies floating inputs by 1/nranks before the sum (process_group.h).
ncclRedOp_t nccl_op(ReduceOp op) { return op == ReduceOp::sum ? ncclSum : ncclAvg; }

cudaEvent_t make_event(const char* op) {
  cudaEvent_t event = nullptr;
  PRECIS_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), op);
  return event;
}

// A collective queued on the communication stream; `done` is recorded after it.
class NcclWork final : public Work {
 public:
  NcclWork(Device device, cudaEvent_t done, const char* op) : device_(device), done_(done), op_(op) {}
  ~NcclWork() override { cudaEventDestroy(done_); }
  void wait() override {
    if (waited_) return;
    cuda::DeviceGuard guard(device_);
    PRECIS_CUDA_CHECK(cudaStreamWaitEvent(cuda::compute_stream(device_), done_, 0), op_);
    waited_ = true;
  }

 private:
  Device device_;
  cudaEvent_t done_;
  const char* op_;
  bool waited_ = false;
};

class NcclProcessGroup final : public ProcessGroup, private cuda::WaitWatcher {
 public:
  NcclProcessGroup(int rank, int world_size, Device device, ShareBytes share_unique_id,
                   std::chrono::milliseconds timeout, std::chrono::milliseconds answer_grace)
      : rank_(rank),
        world_size_(world_size),
        device_(device),
        share_unique_id_(std::move(share_unique_id)),
        watchdog_("nccl", rank, world_size, timeout, answer_grace) {
    PRECIS_CHECK(device.is_cuda(), "nccl process group: needs a GPU device, got ", device);
    const int count = cuda_device_count();
    PRECIS_CHECK(device.index < count, "nccl process group: rank ", rank, " takes GPU ", device.index,
                 " (its local rank) but this host has ", count, " usable GPU(s) (", cuda_status(),
                 "); start at most as many ranks per host as it has GPUs");
    previous_watcher_ = cuda::set_wait_watcher(this);
  }
  ~NcclProcessGroup() override {
    cuda::clear_wait_watcher(this, previous_watcher_);
    if (!ready_) return;  // made with the communicator: nothing was
    cudaSetDevice(device_.index);
    // A communicator in error may have collectives that never complete: abort it, not wait.
    // (synchronize() has aborted it already, and cleared comm_, when it timed out.)
    ncclResult_t async = ncclSuccess;
    const bool failed = comm_ && (ncclCommGetAsyncError(comm_, &async) != ncclSuccess || async != ncclSuccess);
    if (peers_ && failed) peers_->abort();  // its barrier kernels stop waiting for a peer that failed
    if (peers_ && comm_ && !failed) peers_->release();
    peers_.reset();  // an aborted communicator frees what NCCL made for it
    // The registered buffers may outlive the communicator: from now on they are only memory.
    if (registered_) registered_->detach(/*deregister=*/comm_ && !failed);
    if (failed)
      ncclCommAbort(comm_);
    else if (comm_)
      ncclCommDestroy(comm_);
    cudaEventDestroy(ready_);
    if (drained_) cudaEventDestroy(drained_);
  }

  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  Device device() const override { return device_; }
  std::string backend_name() const override { return "nccl"; }

  std::shared_ptr<Allocator> registered_allocator() override {
    if (!registered_) registered_ = std::make_shared<RegisteredAllocator>(device_, communicator());
    return registered_;
  }

  std::vector<int64_t> peer_offsets(const Tensor& buffer, std::string& why) override {
    check_collective_tensor(*this, buffer, "peer_offsets");
    const void* base = buffer.storage()->data();
    PRECIS_CHECK(registered_ && registered_->owns(base) && buffer.raw_data() == base &&
                     buffer.nbytes() == buffer.storage()->nbytes(),
                 "peer_offsets: the buffer must be a whole allocation of registered_allocator()'s");
    if (!peers_ && peers_why_.empty()) peers_ = PeerMemory::make(communicator(), device_, world_size_, peers_why_);
    if (!peers_) {
      why = peers_why_;
      return {};
    }
    return peers_->offsets(registered_->window(base), base);
  }

  void peer_barrier() override {
    PRECIS_CHECK(peers_, "peer_barrier: no peer memory (peer_offsets gave none)");
    ++sequence_;
    last_op_ = "peer_barrier";
    peers_->barrier(cuda::compute_stream(device_));
  }

  std::shared_ptr<Work> all_reduce(const Tensor& tensor, ReduceOp op, Profiler* profiler, Launch launch) override {
    check_collective_tensor(*this, tensor, "all_reduce");
    check_reduce_op(tensor, op, "all_reduce");
    return enqueue(
        "all_reduce", {tensor},
        [&](ncclComm_t comm, cudaStream_t stream) {
          PRECIS_NCCL_CHECK(ncclAllReduce(tensor.raw_data(), tensor.raw_data(), tensor.numel(),
                                          nccl_type(tensor.dtype()), nccl_op(op), comm, stream),
                            "all_reduce");
        },
        profiler, launch);
  }

  std::shared_ptr<Work> broadcast(const Tensor& tensor, int root) override {
    check_collective_tensor(*this, tensor, "broadcast");
    PRECIS_CHECK(root >= 0 && root < world_size_, "broadcast: root ", root, " is not a rank of this group of ",
                 world_size_);
    return enqueue("broadcast", {tensor}, [&](ncclComm_t comm, cudaStream_t stream) {
      PRECIS_NCCL_CHECK(ncclBroadcast(tensor.raw_data(), tensor.raw_data(), tensor.numel(), nccl_type(tensor.dtype()),
                                      root, comm, stream),
                        "broadcast");
    });
  }

  std::shared_ptr<Work> all_gather(const Tensor& output, const Tensor& input, Launch launch) override {
    check_collective_tensor(*this, output, "all_gather");
    check_collective_tensor(*this, input, "all_gather");
    check_gathered_sizes(*this, output, input, "all_gather");
    return enqueue(
        "all_gather", {output, input},
        [&](ncclComm_t comm, cudaStream_t stream) {
          PRECIS_NCCL_CHECK(
              ncclAllGather(input.raw_data(), output.raw_data(), input.numel(), nccl_type(input.dtype()), comm, stream),
              "all_gather");
        },
        nullptr, launch);
  }

  std::shared_ptr<Work> reduce_scatter(const Tensor& output, const Tensor& input, ReduceOp op, Profiler* profiler,
                                       Launch launch) override {
    check_collective_tensor(*this, output, "reduce_scatter");
    check_collective_tensor(*this, input, "reduce_scatter");
    check_gathered_sizes(*this, input, output, "reduce_scatter");
    check_reduce_op(input, op, "reduce_scatter");
    return enqueue(
        "reduce_scatter", {output, input},
        [&](ncclComm_t comm, cudaStream_t stream) {
          PRECIS_NCCL_CHECK(ncclReduceScatter(input.raw_data(), output.raw_data(), output.numel(),
                                              nccl_type(input.dtype()), nccl_op(op), comm, stream),
                            "reduce_scatter");
        },
        profiler, launch);
  }

  // An all-reduce of one element every rank must join, then the host waits for it.
  void barrier() override {
    Tensor token = zeros({1}, DType::f32, device_);
    all_reduce(token, ReduceOp::sum, nullptr, Launch::in_order)->wait();
    cuda::synchronize(device_);
  }

  void synchronize() override {
    if (!comm_) return;
    cuda::DeviceGuard guard(device_);
    if (!drained_) drained_ = make_event("nccl synchronize");
    PRECIS_CUDA_CHECK(cudaEventRecord(drained_, cuda::compute_stream(device_)), "nccl synchronize");
    const auto start = std::chrono::steady_clock::now();
    for (;;) {
      const cudaError_t state = cudaEventQuery(drained_);
      if (state == cudaSuccess) return;
      PRECIS_CHECK(state == cudaErrorNotReady, "nccl synchronize: ", cudaGetErrorString(state));
      const auto waited = std::chrono::steady_clock::now() - start;
      watch(waited);
      std::this_thread::sleep_for(std::chrono::microseconds(waited < std::chrono::milliseconds(1) ? 10 : 200));
    }
  }

  void check_async_error() override {
    if (!comm_) return;
    ncclResult_t async = ncclSuccess;
    PRECIS_NCCL_CHECK(ncclCommGetAsyncError(comm_, &async), "nccl health check");
    PRECIS_CHECK(async == ncclSuccess || async == ncclInProgress, "nccl: rank ", rank_, " of ", world_size_,
                 ": the communicator failed asynchronously: ", ncclGetErrorString(async), " (", ncclGetLastError(comm_),
                 "); a peer rank may have died or lost its connection");
  }

 private:
  // A host wait for the device (synchronize(), or any other: cuda::WaitWatcher) that has lasted
  // `waited`: it may be for a collective that never completes. Fails at once when the
  // communicator failed (a peer died), and with the watchdog's error past the timeout.
  void watch(std::chrono::steady_clock::duration waited) {
    if (!comm_) return;  // no collective yet, or given up already
    check_async_error();
    if (watchdog_.timeout().count() > 0 && waited > watchdog_.timeout()) give_up();
  }
  // cuda::WaitWatcher: the other waits of the thread that made the group (the watchdog's side
  // channel is that thread's, MPI_THREAD_FUNNELED), e.g. an eager step's index check reading
  // back its flag behind the reduce-scatter of a peer that hangs.
  void waited(std::chrono::steady_clock::duration so_far) override {
    if (std::this_thread::get_id() == owner_thread_) watch(so_far);
  }
  [[noreturn]] void give_up() {
    // The collectives in flight never finish: abort them, or the process could not exit.
    if (registered_) registered_->detach(/*deregister=*/false);  // the abort frees what NCCL holds
    if (peers_) peers_->abort();  // a barrier kernel waiting for the missing rank returns
    peers_.reset();
    ncclCommAbort(comm_);
    comm_ = nullptr;
    aborted_ = true;
    // At exit, abort the job rather than wait in MPI_Finalize for a rank that hangs.
    note_collective_given_up();
    // The host waited for what was queued before a collective that had not completed.
    watchdog_.fail({last_op_, sequence_});
  }

  // The communicator, made on the first collective with rank 0's unique id.
  ncclComm_t communicator() {
    if (comm_) return comm_;
    PRECIS_CHECK(!aborted_, "nccl: rank ", rank_, ": the communicator was aborted after a collective timed out; ",
                 "the run cannot go on");
    ncclUniqueId id;
    std::memset(&id, 0, sizeof id);
    if (rank_ == 0) PRECIS_NCCL_CHECK(ncclGetUniqueId(&id), "nccl unique id");
    std::vector<uint8_t> bytes(sizeof id);
    std::memcpy(bytes.data(), &id, sizeof id);
    share_unique_id_(bytes);
    PRECIS_CHECK(bytes.size() == sizeof id, "nccl: rank ", rank_, " received a unique id of ", bytes.size(),
                 " bytes instead of ", sizeof id, "; do all ranks run the same NCCL?");
    std::memcpy(&id, bytes.data(), sizeof id);
    cuda::DeviceGuard guard(device_);
    // NCCL's "graph mixing" guards against collectives of a replayed graph running at the same
    // time as other NCCL work of the communicator that no stream orders after them. Ours are all
    // ordered: a graph replays on the compute stream, an in-order collective queues on it, and one
    // launched beside waits for what the compute stream holds first (enqueue). The guard costs
    // every captured collective an external event wait before it and an event record after it,
    // both off the compute stream's chain: forks, which slow every kernel of the replayed graph
    // (bench/NOTES.md, the twelfth session). Off unless the user set it.
    setenv("NCCL_GRAPH_MIXING_SUPPORT", "0", /*overwrite=*/0);
    PRECIS_NCCL_CHECK(ncclCommInitRank(&comm_, world_size_, id, rank_), "nccl communicator");
    ready_ = make_event("nccl communicator");
    return comm_;
  }

  // Queues `collective` on the communication stream after what the compute stream holds now
  // (Launch::beside), or on the compute stream itself (Launch::in_order: no events, nothing to
  // wait for); with a profiler, its time on its stream (not the wait before it) is "comm".
  template <typename Collective>
  std::shared_ptr<Work> enqueue(const char* op, std::initializer_list<Tensor> tensors, Collective&& collective,
                                Profiler* profiler = nullptr, Launch launch = Launch::beside) {
    ncclComm_t comm = communicator();
    ++sequence_;
    last_op_ = op;
    cuda::DeviceGuard guard(device_);
    cudaStream_t compute = cuda::compute_stream(device_);
    if (launch == Launch::in_order) {
      if (profiler) profiler->begin("comm");
      collective(comm, compute);
      if (profiler) profiler->end();
      return std::make_shared<CompletedWork>();
    }
    cudaStream_t stream = cuda::comm_stream(device_);
    PRECIS_CUDA_CHECK(cudaEventRecord(ready_, compute), op);
    PRECIS_CUDA_CHECK(cudaStreamWaitEvent(stream, ready_, 0), op);
    if (profiler) profiler->begin("comm", Profiler::Stream::communication);
    collective(comm, stream);
    if (profiler) profiler->end();
    for (const Tensor& t : tensors)  // (registered memory waits for the device when it is freed)
      if (t.numel() > 0 && !(registered_ && registered_->owns(t.storage()->data())))
        cuda::record_stream(t.raw_data(), stream);
    cudaEvent_t done = make_event(op);
    PRECIS_CUDA_CHECK(cudaEventRecord(done, stream), op);
    return std::make_shared<NcclWork>(device_, done, op);
  }

  int rank_;
  int world_size_;
  Device device_;
  ShareBytes share_unique_id_;
  Watchdog watchdog_;                      // synchronize()'s timeout and its error
  int64_t sequence_ = 0;                   // collectives queued so far (a CUDA graph's replays: not counted)
  const char* last_op_ = "no collective";  // the last one queued
  ncclComm_t comm_ = nullptr;
  bool aborted_ = false;                             // by synchronize()'s timeout
  cudaEvent_t ready_ = nullptr;                      // recorded on the compute stream before each collective
  cudaEvent_t drained_ = nullptr;                    // synchronize()'s: recorded on the compute stream, polled
  std::shared_ptr<RegisteredAllocator> registered_;  // made by the first registered_allocator()
  std::unique_ptr<PeerMemory> peers_;                // made by the first peer_offsets(), where it can be
  std::string peers_why_;                            // why it cannot
  cuda::WaitWatcher* previous_watcher_ = nullptr;    // set again when this group ends
  std::thread::id owner_thread_ = std::this_thread::get_id();  // the thread whose waits are watched
};

}  // namespace

std::shared_ptr<ProcessGroup> make_nccl_process_group(int rank, int world_size, Device device,
                                                      ShareBytes share_unique_id, std::chrono::milliseconds timeout,
                                                      std::chrono::milliseconds answer_grace) {
  return std::make_shared<NcclProcessGroup>(rank, world_size, device, std::move(share_unique_id), timeout,
                                            answer_grace);
}

}  // namespace precis::distributed

#else

#include "core/error.h"

namespace precis::distributed {

std::shared_ptr<ProcessGroup> make_nccl_process_group(int, int, Device, ShareBytes, std::chrono::milliseconds,
                                                      std::chrono::milliseconds) {
  PRECIS_FAIL("distributed.backend: nccl needs a CUDA build (this one has no CUDA; cmake found no nvcc or NCCL)");
}

}  // namespace precis::distributed

#endif
