// The collective watchdog (--distributed-timeout-minutes): every blocking wait of a ProcessGroup operation polls
// its MPI request against a deadline instead of blocking in MPI_Wait. Past the deadline the waiting rank asks the
// other members of the group, over a private duplicate of MPI_COMM_WORLD and with non-blocking point-to-point
// messages only, what each is waiting on (group name, the group's collective sequence number, operation); every
// rank that waits anywhere answers while it polls. After a grace period, the members that never answered or wait
// at an earlier collective (or another group) are the missing ones: one rank prints one message naming the
// collective and those ranks, and the job is aborted (MPI_Abort), so no rank hangs. Not the collectives
// themselves: those are process_group's.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

namespace moecore::comm {

// What a rank waits on: the group's name, its world ranks, the group's sequence number of this operation and the
// operation ("all_reduce", "barrier", ...).
struct WaitSite {
  const std::string* group = nullptr;
  const std::vector<int>* members = nullptr;  // world ranks of the group (for point-to-point: the peer)
  uint64_t seq = 0;
  const char* op = "";
};

// The timeout in seconds (<= 0: wait forever, MPI_Wait's behaviour), and the flag it came from (named in the
// message). Megatron's default (10 minutes) until the program sets it after ProcessGroup::init.
void set_collective_timeout(double seconds, const std::string& source);
double collective_timeout();
const std::string& collective_timeout_source();  // "--distributed-timeout-minutes 10" (named in messages)

// Called by ProcessGroup::init on every rank (collective): the watchdog's own communicator.
void init_watchdog();
void free_watchdog();

// Waits for `req` to complete, polling with a short back-off and answering other ranks' watchdog queries; past the
// timeout finds the missing ranks, prints the message and aborts the job (never returns then). Returns the MPI
// status code of the completed request. `throw_on_error` false: errors abort (destructors).
int wait_with_watchdog(MPI_Request* req, const WaitSite& site);

// "all-reduce on the expert-data-parallel group": for messages.
std::string describe_site(const std::string& group, const char* op);

}  // namespace moecore::comm
