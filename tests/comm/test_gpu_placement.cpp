// One GPU per rank and the NCCL watchdog, as pure logic on the CPU: the placement of local ranks on visible GPUs
// and the transport it allows (device/device_select.h place_on_gpu), the line a job prints, and the NCCL
// watchdog's decision and message (comm/nccl_fault.h).
#include <gtest/gtest.h>

#include "moecore/comm/nccl_fault.h"
#include "moecore/core/error.h"
#include "moecore/device/device_select.h"

namespace moecore {
namespace {

using device::place_on_gpu;

TEST(GpuPlacement, EachLocalRankOwnsItsGpuWhenThereAreEnough) {
  for (int visible : {4, 8})
    for (int r = 0; r < 4; r++) {
      const device::GpuPlacement p = place_on_gpu(r, 4, visible, "cuda", true);
      EXPECT_EQ(p.device, r);
      EXPECT_TRUE(p.owns_gpu);
      EXPECT_TRUE(p.nccl);
    }
  // auto means the same as cuda once a GPU is used; one process owns GPU 0.
  EXPECT_EQ(place_on_gpu(3, 8, 8, "auto", true).device, 3);
  const device::GpuPlacement one = place_on_gpu(0, 1, 1, "cuda", true);
  EXPECT_EQ(one.device, 0);
  EXPECT_TRUE(one.nccl);
}

TEST(GpuPlacement, RanksShareGpusWhenThereAreFewerAndStayOnHostStagedMpi) {
  // 4 local ranks, 1 GPU: everyone on GPU 0; 8 ranks on 3 GPUs: round robin.
  for (int r = 0; r < 4; r++) {
    const device::GpuPlacement p = place_on_gpu(r, 4, 1, "cuda", true);
    EXPECT_EQ(p.device, 0);
    EXPECT_FALSE(p.owns_gpu);
    EXPECT_FALSE(p.nccl);
  }
  const int expect[8] = {0, 1, 2, 0, 1, 2, 0, 1};
  for (int r = 0; r < 8; r++) {
    const device::GpuPlacement p = place_on_gpu(r, 8, 3, "cuda", true);
    EXPECT_EQ(p.device, expect[r]) << r;
    EXPECT_FALSE(p.nccl);
  }
}

TEST(GpuPlacement, APinnedGpuIsSharedByEveryLocalRank) {
  const device::GpuPlacement p = place_on_gpu(1, 2, 8, "cuda:5", true);
  EXPECT_EQ(p.device, 5);
  EXPECT_FALSE(p.owns_gpu);
  EXPECT_FALSE(p.nccl);
  const device::GpuPlacement alone = place_on_gpu(0, 1, 8, "cuda:5", true);
  EXPECT_EQ(alone.device, 5);
  EXPECT_TRUE(alone.nccl);
}

TEST(GpuPlacement, ABuildWithoutNcclKeepsHostStagedMpi) {
  const device::GpuPlacement p = place_on_gpu(1, 2, 2, "cuda", false);
  EXPECT_EQ(p.device, 1);
  EXPECT_TRUE(p.owns_gpu);
  EXPECT_FALSE(p.nccl);
}

TEST(GpuPlacement, RefusesImpossibleInputs) {
  EXPECT_THROW(place_on_gpu(2, 2, 1, "cuda", true), InternalError);  // local rank out of range
  EXPECT_THROW(place_on_gpu(0, 1, 0, "cuda", true), InternalError);  // no GPU
}

TEST(GpuPlacement, TheStartLineSaysWhichTransportAndWhy) {
  const device::GpuPlacement shared = place_on_gpu(0, 4, 1, "cuda", true);
  EXPECT_EQ(device::describe_placement(shared, 4, 1, false, true),
            "4 ranks on this node share 1 visible GPU(s): GPU tensors go between ranks through host-staged MPI "
            "(NCCL needs one GPU per rank: run at most 1 ranks per node, or make more GPUs visible)");
  const device::GpuPlacement own = place_on_gpu(1, 2, 2, "cuda", true);
  EXPECT_EQ(device::describe_placement(own, 2, 2, true, true),
            "2 ranks on this node, one GPU each (cuda:<local rank>): NCCL between GPUs");
  EXPECT_NE(device::describe_placement(own, 2, 2, false, false).find("built without NCCL"), std::string::npos);
  EXPECT_NE(device::describe_placement(own, 2, 2, false, true).find("another node share GPUs"), std::string::npos);
}

comm::NcclInFlight nccl_in_flight(const std::string& group, const std::string& name, uint64_t seq, double at,
                                  std::vector<int> members, const std::string& error = "") {
  comm::NcclInFlight o;
  o.group = group;
  o.op = name;
  o.seq = seq;
  o.issued_at = at;
  o.members = std::move(members);
  o.async_error = error;
  return o;
}

TEST(NcclWatchdog, NothingWrongWhileEveryOperationIsYoungAndHealthy) {
  const std::vector<comm::NcclInFlight> ops = {nccl_in_flight("dp", "all_reduce", 3, 10.0, {0, 1}),
                                               nccl_in_flight("ep", "all_to_all_v", 7, 12.0, {0, 2})};
  EXPECT_EQ(comm::find_nccl_fault(ops, 20.0, 60.0).kind, comm::NcclFaultKind::None);
  EXPECT_EQ(comm::find_nccl_fault({}, 1e9, 60.0).kind, comm::NcclFaultKind::None);
  // No timeout configured: only errors end the job.
  EXPECT_EQ(comm::find_nccl_fault(ops, 1e9, 0.0).kind, comm::NcclFaultKind::None);
}

TEST(NcclWatchdog, TheOldestOperationPastTheTimeoutIsNamed) {
  const std::vector<comm::NcclInFlight> ops = {nccl_in_flight("dp", "all_reduce", 3, 10.0, {0, 1}),
                                               nccl_in_flight("ep", "all_to_all_v", 7, 12.0, {0, 2})};
  const comm::NcclFault f = comm::find_nccl_fault(ops, 75.0, 60.0);
  EXPECT_EQ(f.kind, comm::NcclFaultKind::Timeout);
  EXPECT_EQ(f.index, 0u);
  EXPECT_DOUBLE_EQ(f.waited, 65.0);
  const std::string m = comm::nccl_fault_message(ops[f.index], f, 1, "--distributed-timeout-minutes 1");
  EXPECT_EQ(m,
            "moecore: all-reduce on the data-parallel group (collective #3 of the dp group) on rank 1 has not "
            "completed after 65.0 s on the GPU, longer than --distributed-timeout-minutes 1 allows.\n"
            "  ranks of that operation: 0, 1\n"
            "  NCCL reports no error: a rank of that operation did not arrive (stalled, deadlocked in computation, "
            "or dead), or the link is stalled.\n"
            "Ending the job (NCCL communicator aborted); if those ranks are only slow, raise "
            "--distributed-timeout-minutes 1.\n");
}

TEST(NcclWatchdog, AnAsynchronousErrorWinsAndIsQuoted) {
  const std::vector<comm::NcclInFlight> ops = {
      nccl_in_flight("dp", "all_reduce", 3, 10.0, {0, 1}),
      nccl_in_flight("ep", "all_to_all_v", 7, 12.0, {0, 2}, "remote process exited or there was a network error")};
  const comm::NcclFault f = comm::find_nccl_fault(ops, 75.0, 60.0);  // the first op has timed out too
  EXPECT_EQ(f.kind, comm::NcclFaultKind::AsyncError);
  EXPECT_EQ(f.index, 1u);
  const std::string m = comm::nccl_fault_message(ops[f.index], f, 0, "--distributed-timeout-minutes 10");
  EXPECT_EQ(m,
            "moecore: all-to-all on the expert-parallel group (collective #7 of the ep group) on rank 0 failed "
            "after 63.0 s: NCCL reports: remote process exited or there was a network error\n"
            "  ranks of that operation: 0, 2\n"
            "Ending the job (NCCL communicator aborted).\n");
}

TEST(NcclWatchdog, APointToPointMessageNamesBothRanks) {
  const comm::NcclInFlight o = nccl_in_flight("cp", "send", 0, 0.0, {3, 4});
  const comm::NcclFault f{comm::NcclFaultKind::Timeout, 0, 700.0};
  const std::string m = comm::nccl_fault_message(o, f, 3, "--distributed-timeout-minutes 10");
  EXPECT_EQ(m.substr(0, m.find('\n')),
            "moecore: a send on the cp group on rank 3 has not completed after 700.0 s on the GPU, longer than "
            "--distributed-timeout-minutes 10 allows.");
  EXPECT_NE(m.find("  ranks of that operation: 3, 4\n"), std::string::npos);
}

}  // namespace
}  // namespace moecore
