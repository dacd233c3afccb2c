// One GPU per rank under mpirun: the local rank from MPI's shared-memory split (on the CPU: every rank of this
// machine is one node), the agreed start-up error, and, where every rank has a GPU of its own, every ProcessGroup
// operation on GPU tensors over NCCL against the host-staged MPI path (within 1e-5). The NCCL tests skip with a
// reason unless this node shows at least as many GPUs as it runs ranks.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "moecore/comm/gpu_transport.h"
#include "moecore/comm/process_group.h"
#include "moecore/core/error.h"
#include "moecore/device/runtime.h"
#include "mpi/nccl_ops.h"

namespace moecore {
namespace {

TEST(LocalRank, EveryRankOfThisMachineIsOnOneNode) {
  const comm::ProcessGroup w = comm::ProcessGroup::world();
  const comm::LocalRank l = comm::local_rank(w.comm());
  EXPECT_EQ(l.rank, w.rank());  // mpirun on one machine: the node's ranks in world order
  EXPECT_EQ(l.size, w.size());
}

TEST(GpuPlacementMpi, TheCpuKeepsHostTransport) {
  const comm::ProcessGroup w = comm::ProcessGroup::world();
  std::string line = "unset";
  EXPECT_EQ(comm::place_ranks_on_gpus("cpu", "train", w.comm(), &line), Device::cpu());
  EXPECT_EQ(line, "");
  EXPECT_EQ(comm::gpu_transport(), comm::GpuTransport::HostStaged);
}

TEST(GpuPlacementMpi, AnUnusableGpuIsOneErrorOnEveryRank) {
  if (device::visible_devices() > 0) GTEST_SKIP() << "a GPU is visible: --device cuda is usable here";
  const comm::ProcessGroup w = comm::ProcessGroup::world();
  std::string what;
  try {
    comm::place_ranks_on_gpus("cuda", "train", w.comm(), nullptr);
  } catch (const Error& e) {
    what = e.what();
  }
  ASSERT_FALSE(what.empty()) << "rank " << w.rank() << " did not refuse --device cuda without a GPU";
  if (w.size() > 1) {
    EXPECT_EQ(what.rfind("rank 0: --device cuda: ", 0), 0u) << what;
  }
  // The same text on every rank: rank 0's length and checksum broadcast and compared.
  Tensor sig = Tensor::zeros({2}, DType::F64);
  double sum = 0;
  for (unsigned char ch : what) sum = std::fmod(sum * 31 + ch, 1e9);
  if (w.rank() == 0) {
    sig.set_item(0, static_cast<double>(what.size()));
    sig.set_item(1, sum);
  }
  w.broadcast(sig, 0);
  EXPECT_EQ(sig.item(0), static_cast<double>(what.size()));
  EXPECT_EQ(sig.item(1), sum);
}

// The GPU tests' operation list on host tensors (MPI): its shapes and counts hold on any layout, and its all-reduce
// and all-gather give what every rank's inputs say.
TEST(GpuNcclHarness, EveryOperationRunsOnHostTensors) {
  const comm::ProcessGroup w = comm::ProcessGroup::world();
  const std::vector<Tensor> r = testing::every_operation(w, Device::cpu());
  ASSERT_EQ(r.size(), w.size() >= 2 && w.rank() < 2 ? 13u : 12u);  // ranks 0 and 1 also exchange a message
  Tensor want = Tensor::zeros({1000}, DType::F32);
  for (int64_t k = 0; k < w.size(); k++) {
    const Tensor x = testing::filled({1000}, k, 1, Device::cpu());
    for (int64_t i = 0; i < 1000; i++) want.data<float>()[i] += x.data<float>()[i];
  }
  for (int64_t i = 0; i < 1000; i++) EXPECT_NEAR(r[0].data<float>()[i], want.data<float>()[i], 1e-5) << i;
  const Tensor last = testing::filled({7, 3}, w.size() - 1, 3, Device::cpu());
  for (int64_t i = 0; i < 21; i++) EXPECT_EQ(r[2].data<float>()[(w.size() - 1) * 21 + i], last.data<float>()[i]);
}

bool nccl_one_gpu_per_rank(std::string* why) {
  const comm::ProcessGroup w = comm::ProcessGroup::world();
  const int visible = device::visible_devices(why);
  const comm::LocalRank l = comm::local_rank(w.comm());
  if (visible < l.size) {
    *why = fmt::format("needs one GPU per rank: {} local ranks, {} GPU(s) visible", l.size, visible);
    return false;
  }
  if (!comm::built_with_nccl()) {
    *why = "this moecore was built without NCCL";
    return false;
  }
  return true;
}

TEST(GpuNccl, EveryOperationMatchesTheHostStagedPath) {
  std::string why;
  // Every rank decides alike (the same node, the same build), so all skip or none does.
  if (!nccl_one_gpu_per_rank(&why)) GTEST_SKIP() << why;
  const comm::ProcessGroup w = comm::ProcessGroup::world();
  std::string line;
  const Device d = comm::place_ranks_on_gpus("cuda", "train", w.comm(), &line);
  ASSERT_EQ(comm::gpu_transport(), comm::GpuTransport::Nccl) << line;
  EXPECT_EQ(d, Device::cuda(static_cast<int>(comm::local_rank(w.comm()).rank)));
  EXPECT_NE(line.find("NCCL between GPUs"), std::string::npos) << line;
  std::vector<int64_t> all;
  for (int64_t r = 0; r < w.size(); r++) all.push_back(r);
  const comm::ProcessGroup g = w.split({all});  // its NCCL communicator made here
  const std::vector<Tensor> nccl = testing::every_operation(g, d);
  comm::set_gpu_transport(comm::GpuTransport::HostStaged);
  const std::vector<Tensor> host = testing::every_operation(g, d);
  testing::expect_same_results(nccl, host, 1e-5);
}

}  // namespace
}  // namespace moecore
