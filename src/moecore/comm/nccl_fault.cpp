// The NCCL watchdog's decision and message (see nccl_fault.h).
#include "moecore/comm/nccl_fault.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "moecore/comm/watchdog.h"

namespace moecore::comm {

NcclFault find_nccl_fault(const std::vector<NcclInFlight>& ops, double now, double timeout) {
  for (size_t i = 0; i < ops.size(); i++)
    if (!ops[i].async_error.empty()) return {NcclFaultKind::AsyncError, i, now - ops[i].issued_at};
  if (timeout > 0)
    for (size_t i = 0; i < ops.size(); i++)
      if (now - ops[i].issued_at > timeout) return {NcclFaultKind::Timeout, i, now - ops[i].issued_at};
  return {};
}

std::string nccl_fault_message(const NcclInFlight& op, const NcclFault& f, int world_rank,
                               const std::string& timeout_source) {
  const std::string where = describe_site(op.group, op.op.c_str());
  const std::string which =
      op.seq > 0 ? fmt::format("{} (collective #{} of the {} group)", where, op.seq, op.group) : where;
  const std::string ranks = fmt::format("  ranks of that operation: {}\n", fmt::join(op.members, ", "));
  if (f.kind == NcclFaultKind::AsyncError)
    return fmt::format(
        "moecore: {} on rank {} failed after {:.1f} s: NCCL reports: {}\n{}"
        "Ending the job (NCCL communicator aborted).\n",
        which, world_rank, f.waited, op.async_error, ranks);
  return fmt::format(
      "moecore: {} on rank {} has not completed after {:.1f} s on the GPU, longer than {} allows.\n{}"
      "  NCCL reports no error: a rank of that operation did not arrive (stalled, deadlocked in computation, or "
      "dead), or the link is stalled.\n"
      "Ending the job (NCCL communicator aborted); if those ranks are only slow, raise {}.\n",
      which, world_rank, f.waited, timeout_source, ranks, timeout_source);
}

}  // namespace moecore::comm
