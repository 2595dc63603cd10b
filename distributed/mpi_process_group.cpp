#include "distributed/mpi_process_group.h"

#include "distributed/mpi_runtime.h"
#include "distributed/watchdog.h"

#if PRECIS_WITH_MPI
#include <climits>
#include <vector>

#include "core/autograd.h"
#include "core/copy.h"
#include "distributed/mpi_check.h"
#include "ops/elementwise.h"
#endif

namespace precis::distributed {

#if PRECIS_WITH_MPI

namespace {

// The 2-byte datatypes of bf16 and f16 and their sum (see the top of the header).
struct SixteenBitTypes {
  MPI_Datatype bf16 = MPI_DATATYPE_NULL;
  MPI_Datatype f16 = MPI_DATATYPE_NULL;
  MPI_Op sum = MPI_OP_NULL;
};

const SixteenBitTypes& sixteen_bit_types();

template <typename T>
void sum_into(const void* in, void* inout, int count) {
  const T* a = static_cast<const T*>(in);
  T* b = static_cast<T*>(inout);
  for (int i = 0; i < count; ++i) b[i] = T(static_cast<float>(a[i]) + static_cast<float>(b[i]));
}

// inout[i] = round(f32(in[i]) + f32(inout[i])), MPI_User_function's signature.
void sum_16bit(void* in, void* inout, int* count, MPI_Datatype* type) {
  if (*type == sixteen_bit_types().bf16)
    sum_into<bfloat16>(in, inout, *count);
  else
    sum_into<half>(in, inout, *count);
}

const SixteenBitTypes& sixteen_bit_types() {
  static const SixteenBitTypes types = [] {
    SixteenBitTypes t;
    PRECIS_MPI_CHECK(MPI_Type_contiguous(2, MPI_BYTE, &t.bf16), "mpi bf16 type");
    PRECIS_MPI_CHECK(MPI_Type_commit(&t.bf16), "mpi bf16 type");
    PRECIS_MPI_CHECK(MPI_Type_contiguous(2, MPI_BYTE, &t.f16), "mpi f16 type");
    PRECIS_MPI_CHECK(MPI_Type_commit(&t.f16), "mpi f16 type");
    PRECIS_MPI_CHECK(MPI_Op_create(sum_16bit, /*commute=*/1, &t.sum), "mpi 16-bit sum");
    return t;
  }();
  return types;
}

MPI_Datatype mpi_type(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return MPI_FLOAT;
    case DType::f64:
      return MPI_DOUBLE;
    case DType::i32:
      return MPI_INT32_T;
    case DType::i64:
      return MPI_INT64_T;
    case DType::bf16:
      return sixteen_bit_types().bf16;
    case DType::f16:
      return sixteen_bit_types().f16;
    default:
      PRECIS_FAIL("mpi: unsupported dtype ", dtype);
  }
}

// Both avg and sum are sums on the wire (avg's division comes first, on each rank).
MPI_Op mpi_sum(DType dtype) { return dtype == DType::bf16 || dtype == DType::f16 ? sixteen_bit_types().sum : MPI_SUM; }

int mpi_count(int64_t numel, const char* op) {
  PRECIS_CHECK(numel <= INT_MAX, op, ": ", numel, " elements is more than one MPI call takes");
  return static_cast<int>(numel);
}

// A nonblocking collective; wait() gives up after the group's timeout (mpi_check.h) with the
// watchdog's error (watchdog.h), which names where the other ranks are.
class MpiWork final : public Work {
 public:
  struct Context {
    std::shared_ptr<const Watchdog> watchdog;
    int64_t sequence;  // of the collective in its group (watchdog.h)
  };
  MpiWork(MPI_Request request, std::vector<Tensor> tensors, const char* op, Context context,
          Profiler* profiler = nullptr)
      : request_(request),
        tensors_(std::make_shared<std::vector<Tensor>>(std::move(tensors))),
        op_(op),
        context_(std::move(context)),
        profiler_(profiler) {}
  ~MpiWork() override {
    // A request must complete before its buffers go; errors here have nowhere to go.
    if (request_ != MPI_REQUEST_NULL) MPI_Wait(&request_, MPI_STATUS_IGNORE);
  }
  void wait() override {
    if (request_ == MPI_REQUEST_NULL) return;
    if (profiler_) profiler_->begin("comm");
    try {
      if (!wait_with_timeout(request_, op_, context_.watchdog->timeout(), tensors_))
        context_.watchdog->fail({op_, context_.sequence});
    } catch (...) {
      if (profiler_) profiler_->end();
      throw;
    }
    if (profiler_) profiler_->end();
    tensors_.reset();
  }

 private:
  MPI_Request request_;
  std::shared_ptr<std::vector<Tensor>> tensors_;  // alive until the collective is done
  const char* op_;
  Context context_;
  Profiler* profiler_;  // times wait() as "comm", or null
};

class MpiProcessGroup final : public ProcessGroup {
 public:
  MpiProcessGroup(std::chrono::milliseconds timeout, std::chrono::milliseconds answer_grace) {
    init_mpi();
    PRECIS_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &comm_), "mpi process group");
    PRECIS_MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "mpi process group");
    PRECIS_MPI_CHECK(MPI_Comm_rank(comm_, &rank_), "mpi process group");
    PRECIS_MPI_CHECK(MPI_Comm_size(comm_, &world_size_), "mpi process group");
    watchdog_ = std::make_shared<const Watchdog>("mpi", rank_, world_size_, timeout, answer_grace);
  }
  ~MpiProcessGroup() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(&comm_);
  }

  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  Device device() const override { return Device::cpu(); }
  std::string backend_name() const override { return "mpi"; }

  // Its collectives are nonblocking host calls that wait() completes: Launch changes nothing here.
  std::shared_ptr<Work> all_reduce(const Tensor& tensor, ReduceOp op, Profiler* profiler, Launch) override {
    check_collective_tensor(*this, tensor, "all_reduce");
    check_reduce_op(tensor, op, "all_reduce");
    if (op == ReduceOp::avg) divide_by_world_size(tensor);
    if (profiler) profiler->begin("comm");  // the MPI call only, as NCCL's (the division is compute)
    MPI_Request request;
    const int result = MPI_Iallreduce(MPI_IN_PLACE, tensor.raw_data(), mpi_count(tensor.numel(), "all_reduce"),
                                      mpi_type(tensor.dtype()), mpi_sum(tensor.dtype()), comm_, &request);
    if (profiler) profiler->end();
    PRECIS_MPI_CHECK(result, "all_reduce");
    return std::make_shared<MpiWork>(request, std::vector<Tensor>{tensor}, "all_reduce", context(), profiler);
  }

  std::shared_ptr<Work> broadcast(const Tensor& tensor, int root) override {
    check_collective_tensor(*this, tensor, "broadcast");
    check_root(root);
    MPI_Request request;
    PRECIS_MPI_CHECK(MPI_Ibcast(tensor.raw_data(), mpi_count(tensor.numel(), "broadcast"), mpi_type(tensor.dtype()),
                                root, comm_, &request),
                     "broadcast");
    return std::make_shared<MpiWork>(request, std::vector<Tensor>{tensor}, "broadcast", context());
  }

  std::shared_ptr<Work> all_gather(const Tensor& output, const Tensor& input, Launch) override {
    check_collective_tensor(*this, output, "all_gather");
    check_collective_tensor(*this, input, "all_gather");
    check_gathered_sizes(*this, output, input, "all_gather");
    MPI_Datatype type = mpi_type(input.dtype());
    int count = mpi_count(input.numel(), "all_gather");
    mpi_count(output.numel(), "all_gather");
    // In place when the input is this rank's chunk of the output (ZeRO-1's parameter gather):
    // MPI takes that as MPI_IN_PLACE, not as an aliased send buffer.
    const char* chunk = static_cast<const char*>(output.raw_data()) +
                        static_cast<int64_t>(rank_) * input.numel() * static_cast<int64_t>(element_size(input.dtype()));
    const void* sent = input.raw_data() == chunk ? MPI_IN_PLACE : input.raw_data();
    MPI_Request request;
    PRECIS_MPI_CHECK(MPI_Iallgather(sent, count, type, output.raw_data(), count, type, comm_, &request), "all_gather");
    return std::make_shared<MpiWork>(request, std::vector<Tensor>{output, input}, "all_gather", context());
  }

  std::shared_ptr<Work> reduce_scatter(const Tensor& output, const Tensor& input, ReduceOp op, Profiler* profiler,
                                       Launch) override {
    check_collective_tensor(*this, output, "reduce_scatter");
    check_collective_tensor(*this, input, "reduce_scatter");
    check_gathered_sizes(*this, input, output, "reduce_scatter");
    check_reduce_op(input, op, "reduce_scatter");
    mpi_count(input.numel(), "reduce_scatter");
    // The input is left as it was: avg divides a copy. In place (the output is this rank's chunk
    // of the input, as ZeRO-1 reduces), MPI must not read what it writes: it sends a copy.
    const char* chunk =
        static_cast<const char*>(input.raw_data()) +
        static_cast<int64_t>(rank_) * output.numel() * static_cast<int64_t>(element_size(input.dtype()));
    Tensor sent = input;
    if (op == ReduceOp::avg || output.raw_data() == chunk) sent = input.clone();
    if (op == ReduceOp::avg) divide_by_world_size(sent);
    MPI_Request request;
    if (profiler) profiler->begin("comm");
    const int result =
        MPI_Ireduce_scatter_block(sent.raw_data(), output.raw_data(), mpi_count(output.numel(), "reduce_scatter"),
                                  mpi_type(input.dtype()), mpi_sum(input.dtype()), comm_, &request);
    if (profiler) profiler->end();
    PRECIS_MPI_CHECK(result, "reduce_scatter");
    return std::make_shared<MpiWork>(request, std::vector<Tensor>{output, sent}, "reduce_scatter", context(), profiler);
  }

  void barrier() override {
    MPI_Request request;
    PRECIS_MPI_CHECK(MPI_Ibarrier(comm_, &request), "barrier");
    MpiWork(request, {}, "barrier", context()).wait();
  }

 private:
  void check_root(int root) const {
    PRECIS_CHECK(root >= 0 && root < world_size_, "broadcast: root ", root, " is not a rank of this group of ",
                 world_size_);
  }
  // tensor <- tensor * (1 / world_size), rounded to its dtype (avg's division, before the sum).
  void divide_by_world_size(const Tensor& tensor) const {
    NoGradGuard no_grad;
    copy_(tensor, ops::mul(tensor, 1.0 / world_size_));
  }

  // The context of the next collective: counts it (every collective, barrier included).
  MpiWork::Context context() { return {watchdog_, ++sequence_}; }

  std::shared_ptr<const Watchdog> watchdog_;  // shared with the Works, which may outlive the group
  int64_t sequence_ = 0;                      // collectives called so far
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int world_size_ = 1;
};

}  // namespace

std::shared_ptr<ProcessGroup> make_mpi_process_group(std::chrono::milliseconds timeout,
                                                     std::chrono::milliseconds answer_grace) {
  return std::make_shared<MpiProcessGroup>(timeout, answer_grace);
}

#else

std::shared_ptr<ProcessGroup> make_mpi_process_group(std::chrono::milliseconds, std::chrono::milliseconds) {
  init_mpi();  // throws: no MPI in this build
  return nullptr;
}

#endif

}  // namespace precis::distributed
