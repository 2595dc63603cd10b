// PRECIS_MPI_CHECK(call, op): an MPI call whose failure becomes a precis::Error
// naming the op and MPI's message. Include only from .cpp files built with
// PRECIS_WITH_MPI (it includes mpi.h).
#pragma once

#include <mpi.h>

#include <chrono>
#include <memory>
#include <string>

#include "core/error.h"

namespace precis::distributed {

inline std::string mpi_error_text(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) return "MPI error " + std::to_string(code);
  return std::string(text, length);
}

// MPI_Wait on `request` for at most `timeout` (zero: forever); false when it gave up (a
// peer that died or hangs never joins: the caller reports it, watchdog.h). A collective
// cannot be cancelled, so a request given up on is kept (and `keep_alive`, its buffers,
// with it) until MPI completes it or finalize_mpi aborts the job (mpi_runtime.h); `request`
// becomes MPI_REQUEST_NULL.
bool wait_with_timeout(MPI_Request& request, const char* op, std::chrono::milliseconds timeout,
                       std::shared_ptr<void> keep_alive);

}  // namespace precis::distributed

#define PRECIS_MPI_CHECK(call, op)                                                                                 \
  do {                                                                                                             \
    int precis_mpi_status_ = (call);                                                                               \
    if (precis_mpi_status_ != MPI_SUCCESS)                                                                         \
      PRECIS_FAIL(op, ": MPI error (", ::precis::distributed::mpi_error_text(precis_mpi_status_), ") in ", #call); \
  } while (0)
