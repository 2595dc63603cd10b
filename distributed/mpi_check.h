// PRECIS_MPI_CHECK(call, op): an MPI call whose failure becomes a precis::Error
// naming the op and MPI's message. Include only from .cpp files built with
// PRECIS_WITH_MPI (it includes mpi.h).
#pragma once

#include <mpi.h>

#include <string>

#include "core/error.h"

namespace precis::distributed {

inline std::string mpi_error_text(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) return "MPI error " + std::to_string(code);
  return std::string(text, length);
}

}  // namespace precis::distributed

#define PRECIS_MPI_CHECK(call, op)                                                                                 \
  do {                                                                                                             \
    int precis_mpi_status_ = (call);                                                                               \
    if (precis_mpi_status_ != MPI_SUCCESS)                                                                         \
      PRECIS_FAIL(op, ": MPI error (", ::precis::distributed::mpi_error_text(precis_mpi_status_), ") in ", #call); \
  } while (0)
