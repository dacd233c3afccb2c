// The NCCL watchdog's decision and message, pure so the CPU tests hold them (the thread that polls the GPU is in
// comm/nccl_comm.cpp). An NCCL operation cannot be waited on like an MPI request: the host never blocks on it, so a
// background thread watches every launched operation until its event completes, and ends the job when NCCL reports
// an asynchronous error on the operation's communicator or the operation outlives --distributed-timeout-minutes.
// Same words as the MPI watchdog (comm/watchdog.h): the group, the collective and its number, the ranks.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace moecore::comm {

// One launched NCCL operation that has not completed, as the watchdog last saw it.
struct NcclInFlight {
  std::string group;         // "dp", "ep", ... (the ProcessGroup's name)
  std::vector<int> members;  // world ranks involved (a point-to-point operation: this rank and the peer)
  uint64_t seq = 0;          // the group's collective number (0 for point-to-point)
  std::string op;            // "all_reduce", "all_to_all_v", "send", ...
  double issued_at = 0;      // seconds (core/timer.h's clock)
  std::string async_error;   // ncclCommGetAsyncError's text for its communicator; empty while none
};

enum class NcclFaultKind { None, AsyncError, Timeout };
struct NcclFault {
  NcclFaultKind kind = NcclFaultKind::None;
  size_t index = 0;   // which operation of the list
  double waited = 0;  // seconds since it was launched
};

// The first fault among `ops` (oldest first): an asynchronous error wins over a timeout (it names the cause);
// a timeout is an operation older than `timeout` seconds (<= 0: no timeout).
NcclFault find_nccl_fault(const std::vector<NcclInFlight>& ops, double now, double timeout);

// The message printed before the job ends: what failed or waited, on which group, its ranks, NCCL's error.
std::string nccl_fault_message(const NcclInFlight& op, const NcclFault& f, int world_rank,
                               const std::string& timeout_source);

}  // namespace moecore::comm
