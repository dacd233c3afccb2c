// The checking macros every MPI call goes through (STYLE rule 6): MOE_MPI throws with the MPI error string and the
// call's text; MOE_MPI_NOTHROW, for destructors and move operations that must not throw, prints the same and
// aborts the job, since a failed wait or free there leaves buffers in an unknown state. Only comm/ includes it.
#pragma once

#include <mpi.h>

namespace moecore::comm {

void check_mpi(int rc, const char* what);
void check_mpi_nothrow(int rc, const char* what) noexcept;

}  // namespace moecore::comm

#define MOE_MPI(call) ::moecore::comm::check_mpi((call), #call)
#define MOE_MPI_NOTHROW(call) ::moecore::comm::check_mpi_nothrow((call), #call)
