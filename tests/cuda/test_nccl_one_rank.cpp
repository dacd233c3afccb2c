// NCCL on one GPU: the placement of a process that owns its GPU, communicators of one rank made from MPI (the unique
// id broadcast over the group), and every ProcessGroup operation on GPU tensors over NCCL equal to the host-staged
// MPI path bit for bit. Skipped where no GPU is visible. (Training on one process makes no groups: nothing to
// compare there.)
#include <gtest/gtest.h>

#include "gpu_util.h"
#include "moecore/comm/gpu_transport.h"
#include "moecore/comm/process_group.h"
#include "moecore/device/runtime.h"
#include "mpi/nccl_ops.h"

namespace moecore {
namespace {

#define MOE_REQUIRE_NCCL()                                                                         \
  do {                                                                                             \
    MOE_REQUIRE_GPU();                                                                             \
    if (!comm::built_with_nccl()) GTEST_SKIP() << "needs NCCL: this moecore was built without it"; \
    comm::ProcessGroup::init(nullptr, nullptr); /* a singleton MPI process: no mpirun needed */    \
  } while (0)

TEST(NcclOneRank, PlacementChoosesNcclForAProcessThatOwnsItsGpu) {
  MOE_REQUIRE_NCCL();
  const comm::ProcessGroup w = comm::ProcessGroup::world();
  std::string line;
  EXPECT_EQ(comm::place_ranks_on_gpus("cuda", "train", w.comm(), &line), Device::cuda(0));
  EXPECT_EQ(comm::gpu_transport(), comm::GpuTransport::Nccl);
  EXPECT_EQ(line, "1 rank on this node, one GPU each (cuda:<local rank>): NCCL between GPUs");
  comm::set_gpu_transport(comm::GpuTransport::HostStaged);
}

TEST(NcclOneRank, EveryOperationEqualsTheHostStagedPath) {
  MOE_REQUIRE_NCCL();
  device::set_current_device(Device::cuda(0));
  comm::set_gpu_transport(comm::GpuTransport::Nccl);
  const comm::ProcessGroup w = comm::ProcessGroup::world();
  const comm::ProcessGroup g = w.split({{0}});  // a one-rank NCCL communicator, made from MPI
  const std::vector<Tensor> nccl = testing::every_operation(g, Device::cuda(0));
  comm::set_gpu_transport(comm::GpuTransport::HostStaged);
  const std::vector<Tensor> host = testing::every_operation(g, Device::cuda(0));
  testing::expect_same_results(nccl, host, 0.0);  // one rank: every result is a copy, bit for bit
}

}  // namespace
}  // namespace moecore
