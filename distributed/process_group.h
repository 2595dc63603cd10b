// A process group: the ranks of one data-parallel job and the collectives they
// run together (docs/architecture.md, "Data parallelism"), as torch.distributed's ProcessGroup.
//
// Every rank calls the same collectives in the same order, with tensors of the
// same shape and dtype (the root's shape for broadcast). Tensors are dense and
// contiguous; all_reduce and broadcast work in place. Each call returns a Work
// whose wait() makes the results usable:
//   - MPI backend (CPU tensors, mpi_process_group.h): nonblocking MPI_I* calls;
//     wait() blocks until the result is in the tensor.
//   - NCCL backend (GPU tensors, cuda/nccl_process_group.h): the collective waits
//     for the work already queued on the device's compute stream, runs on the
//     communication stream, and wait() makes the compute stream wait for it (an
//     event; the host does not block). Kernels queued after wait() see the result.
// Until wait() the tensors must not be written (or, on the CPU, read).
//
// Where a collective runs (`Launch`; the NCCL backend, the MPI backend has no streams):
//   beside    as above, on the communication stream: the compute queued after it overlaps it
//             until wait() (the reducer's buckets during the backward, ZeRO-1's all-gather
//             behind the next forward);
//   in_order  on the compute stream itself, in order with the kernels around it; wait() has
//             nothing left to do (the MPI backend: the same as beside). For a collective
//             waited for at once nothing would overlap it, and a captured step with a second
//             stream is a graph with forks, which starts each of its kernels later than a
//             one-stream graph does (bench/NOTES.md, the eleventh session).
// A collective launched in order must not be queued while one launched beside it on the same
// group is still unwaited (NCCL runs one communicator's collectives one at a time, in the
// order every rank queued them).
//
// all_reduce and reduce_scatter can be timed: given a Profiler, the collective's own time is a phase
// "comm" (NCCL: CUDA events on the communication stream around the NCCL call, after
// its wait for the compute stream; MPI: the host time in MPI_Iallreduce and in the
// MPI_Wait of wait(), where MPI does most of the work of a nonblocking collective).
//
// avg is sum / world_size with the division first: each rank's values are
// multiplied by 1/world_size, then summed (NCCL's ncclAvg does the same for
// floating dtypes). For bf16/f16 this keeps the sum of N rank's gradients from
// overflowing f16 and costs one rounding; for world sizes that are powers of two
// the multiplication is exact.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/profiler.h"
#include "core/tensor.h"

namespace precis::distributed {

enum class ReduceOp { sum, avg };
const char* reduce_op_name(ReduceOp op);
enum class Launch { beside, in_order };

// A collective in flight.
class Work {
 public:
  virtual ~Work() = default;
  // Makes the collective's results usable (see the top of this file). Idempotent.
  virtual void wait() = 0;
};

class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;

  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // Where its tensors live: the CPU (MPI) or this rank's GPU (NCCL).
  virtual Device device() const = 0;
  // "mpi" or "nccl".
  virtual std::string backend_name() const = 0;
  // Where to allocate a buffer that collectives use step after step (ZeRO-1's flat
  // parameter buffer, all-gathered every step): the NCCL backend's memory registered with
  // its communicator, which NCCL reads and writes in place (distributed/cuda/
  // registered_memory.h; it makes the communicator, collectively, if it is not made yet,
  // so every rank calls it at the same point); null where the device's own memory serves
  // as well (MPI).
  virtual std::shared_ptr<Allocator> registered_allocator() { return nullptr; }
  // Stores into the peers' copies (distributed/cuda/peer_memory.h; ZeRO-1's fused gather):
  // for `buffer`, the whole of an allocation of registered_allocator()'s made alike on every
  // rank, where its bytes are in each rank's copy, as byte offsets from this rank's address of
  // them (element i of rank r's copy is at (char*)&mine[i] + offsets[r]; offsets[rank] is 0),
  // so that a kernel may store into every rank's copy. Empty, with `why` set, where the ranks
  // cannot (the MPI backend; GPUs that cannot load and store to each other's memory). A
  // collective: every rank asks for its buffer of the same allocation, in the same order.
  virtual std::vector<int64_t> peer_offsets(const Tensor& buffer, std::string& why) {
    (void)buffer;
    why = "the " + backend_name() + " backend has no memory the ranks share";
    return {};
  }
  // Queued in order on the compute stream after kernels that stored into peers' copies: what
  // each rank stored before it is visible to the work every rank queues after it. Only where
  // peer_offsets gave offsets.
  virtual void peer_barrier() { PRECIS_FAIL("peer_barrier: the ", backend_name(), " backend has no peer memory"); }

  // tensor <- op over ranks of tensor (in place); timed as phase "comm" of `profiler` if given.
  virtual std::shared_ptr<Work> all_reduce(const Tensor& tensor, ReduceOp op, Profiler* profiler = nullptr,
                                           Launch launch = Launch::beside) = 0;
  // tensor <- tensor of rank `root` (in place).
  virtual std::shared_ptr<Work> broadcast(const Tensor& tensor, int root) = 0;
  // output (world_size * input.numel() elements) <- the inputs of ranks 0, 1, ... one after another.
  // In place when the input is this rank's chunk of the output (both backends).
  virtual std::shared_ptr<Work> all_gather(const Tensor& output, const Tensor& input,
                                           Launch launch = Launch::beside) = 0;
  // output (input.numel() / world_size elements) <- chunk `rank` of op over ranks of input.
  // In place when the output is this rank's chunk of the input (both backends).
  // Timed as phase "comm" of `profiler` if given, as all_reduce.
  virtual std::shared_ptr<Work> reduce_scatter(const Tensor& output, const Tensor& input, ReduceOp op,
                                               Profiler* profiler = nullptr, Launch launch = Launch::beside) = 0;
  // Returns once every rank has called it (the NCCL backend: and its queued work has completed).
  virtual void barrier() = 0;
  // Throws a precis::Error if the backend has noticed an asynchronous failure (a peer
  // that died, a network error); the fault watchdog calls it. MPI reports errors per call.
  virtual void check_async_error() {}
  // The watchdog's wait before the host reads results: returns once the work queued on the
  // group's device (its collectives included) has completed; the NCCL backend polls for
  // asynchronous errors meanwhile and, past the group's timeout, aborts the communicator and
  // throws the watchdog's error (watchdog.h: this rank, the last collective queued, and the
  // ranks that are missing). The MPI backend has nothing queued (its waits time out).
  virtual void synchronize() {}
};

// A Work that is already complete (nothing to wait for).
class CompletedWork final : public Work {
 public:
  void wait() override {}
};

// Checks what every backend requires of a collective's tensor: defined, dense and
// contiguous, on the group's device, of a supported dtype (f32, f64, f16, bf16,
// i32, i64), and floating for avg. `op_name` names the collective in the error.
void check_collective_tensor(const ProcessGroup& group, const Tensor& tensor, const char* op_name);
void check_reduce_op(const Tensor& tensor, ReduceOp op, const char* op_name);
// all_gather / reduce_scatter: `big` must hold world_size times the elements of `small`, same dtype.
void check_gathered_sizes(const ProcessGroup& group, const Tensor& big, const Tensor& small, const char* op_name);

}  // namespace precis::distributed
