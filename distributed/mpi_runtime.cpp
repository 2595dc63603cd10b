#include "distributed/mpi_runtime.h"

#include <atomic>
#include <cstdlib>

#include "core/error.h"

#if PRECIS_WITH_MPI
#include <climits>
#include <iostream>
#include <thread>
#include <vector>

#include "distributed/mpi_check.h"
#endif

namespace precis::distributed {

namespace {
std::atomic<bool> g_given_up{false};
}  // namespace

void note_collective_given_up() { g_given_up = true; }
bool collective_given_up() { return g_given_up; }
void clear_collective_given_up() { g_given_up = false; }

#if PRECIS_WITH_MPI

namespace {
bool initialized_here = false;

struct Abandoned {
  MPI_Request request;
  std::shared_ptr<void> keep_alive;
};
// Never destroyed: finalize_mpi runs at exit, after the destructors of statics made later than its registration.
std::vector<Abandoned>& abandoned() {
  static auto* requests = new std::vector<Abandoned>;
  return *requests;
}

// Whether `request` completed by `deadline` (polling: MPI_Wait cannot time out).
bool test_until(MPI_Request& request, std::chrono::steady_clock::time_point deadline, const char* op) {
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    int done = 0;
    PRECIS_MPI_CHECK(MPI_Test(&request, &done, MPI_STATUS_IGNORE), op);
    if (done) return true;
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) return false;
    // Spin for the first millisecond (a collective about to complete), then let the core go.
    if (now - start > std::chrono::milliseconds(1)) std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

void check_initialized(const char* op) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  PRECIS_CHECK(initialized, op, ": MPI is not initialized (call init_mpi first)");
}
}  // namespace

bool built_with_mpi() { return true; }

void init_mpi() {
  int initialized = 0;
  PRECIS_MPI_CHECK(MPI_Initialized(&initialized), "init_mpi");
  if (initialized) return;
  int provided = 0;
  PRECIS_MPI_CHECK(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided), "init_mpi");
  initialized_here = true;
  PRECIS_MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN), "init_mpi");
  std::atexit(finalize_mpi);
}

bool wait_with_timeout(MPI_Request& request, const char* op, std::chrono::milliseconds timeout,
                       std::shared_ptr<void> keep_alive) {
  if (timeout.count() <= 0) {
    PRECIS_MPI_CHECK(MPI_Wait(&request, MPI_STATUS_IGNORE), op);
    return true;
  }
  if (test_until(request, std::chrono::steady_clock::now() + timeout, op)) return true;
  abandoned().push_back({request, std::move(keep_alive)});
  request = MPI_REQUEST_NULL;
  return false;
}

void finalize_mpi() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!initialized_here || finalized) return;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  for (Abandoned& a : abandoned()) {
    bool done = false;
    try {
      done = test_until(a.request, deadline, "finalize_mpi");
    } catch (const Error&) {  // at exit: nothing to report it to; the job is aborted below
    }
    if (!done) {
      std::cerr << "error: a collective given up on after its timeout never completed: a peer rank is gone; "
                   "aborting the job\n";
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
  }
  abandoned().clear();
  if (collective_given_up()) {
    std::cerr << "error: this rank gave up on a collective after its timeout; aborting the job rather than "
                 "waiting at exit for ranks that may never come\n";
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  MPI_Finalize();
}

void abort_job_after_error(int exit_code) {
  int finalized = 0, size = 1;
  MPI_Finalized(&finalized);
  if (!initialized_here || finalized) return;
  if (MPI_Comm_size(MPI_COMM_WORLD, &size) != MPI_SUCCESS || size < 2) return;
  std::cerr << std::flush;
  MPI_Abort(MPI_COMM_WORLD, exit_code);
}

int mpi_world_rank() {
  check_initialized("mpi_world_rank");
  int rank = 0;
  PRECIS_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank), "mpi_world_rank");
  return rank;
}

int mpi_world_size() {
  check_initialized("mpi_world_size");
  int size = 0;
  PRECIS_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &size), "mpi_world_size");
  return size;
}

void mpi_broadcast_bytes(void* data, size_t bytes, int root) {
  check_initialized("mpi_broadcast_bytes");
  PRECIS_CHECK(bytes <= static_cast<size_t>(INT_MAX), "mpi_broadcast_bytes: ", bytes,
               " bytes is more than one call takes");
  PRECIS_MPI_CHECK(MPI_Bcast(data, static_cast<int>(bytes), MPI_BYTE, root, MPI_COMM_WORLD), "mpi_broadcast_bytes");
}

#else

namespace {
[[noreturn]] void no_mpi(const char* op) {
  PRECIS_FAIL(op,
              ": this build has no MPI (cmake found none); install OpenMPI (scripts/setup.sh does) and "
              "reconfigure, or launch with torchrun-style variables and the nccl backend");
}
}  // namespace

bool built_with_mpi() { return false; }
void init_mpi() { no_mpi("init_mpi"); }
void finalize_mpi() {}
void abort_job_after_error(int) {}
int mpi_world_rank() { no_mpi("mpi_world_rank"); }
int mpi_world_size() { no_mpi("mpi_world_size"); }
void mpi_broadcast_bytes(void*, size_t, int) { no_mpi("mpi_broadcast_bytes"); }

#endif

}  // namespace precis::distributed
