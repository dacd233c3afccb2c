// The expert-parallel dispatchers (AlltoAll, AllGather) and expert tensor parallelism with GPU tensors, against the
// same classes on host tensors, under mpirun with every rank on GPU 0 (MPI traffic is host-staged, so ranks can
// share one GPU). Each test skips where no GPU is visible, so the CPU-only CTest runs pass them.
// The lead's GPU run: mpirun -np 2 moecore_mpi_tests --gtest_filter='GpuDispatch.*'
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <vector>

#include "cuda/gpu_util.h"
#include "dispatch_util.h"
#include "moecore/comm/process_group.h"
#include "moecore/moe/expert_tensor_parallel.h"
#include "moecore/moe/token_dispatcher.h"

namespace moecore {
namespace {

using testing::dispatch_values;
using testing::dropped_routing;

bool same_bits(const Tensor& gpu_t, const Tensor& cpu_t) {
  const Tensor a = gpu_t.to(Device::cpu());
  return a.nbytes() == cpu_t.nbytes() &&
         std::equal(static_cast<const char*>(a.raw()), static_cast<const char*>(a.raw()) + a.nbytes(),
                    static_cast<const char*>(cpu_t.raw()));
}

template <typename Dispatcher>
void compare(const char* name) {
  SCOPED_TRACE(name);
  const comm::ProcessGroup w = comm::ProcessGroup::world();
  const int64_t T = 24, K = 2, H = 20, E = 2 * w.size();
  const uint64_t seed = 100 + static_cast<uint64_t>(w.rank()) * 17;
  const moe::RoutedTokens rc = dropped_routing(T, K, E, seed);
  const moe::RoutedTokens rg{rc.idx_TK.to(Device::cuda()), rc.probs_TK.to(Device::cuda()), 0};
  const Tensor x = dispatch_values({T, H}, seed + 5);
  Dispatcher cd(w, E), gd(w, E);
  moe::DispatchPlan cp, gp;
  Tensor cx, cpr, gx, gpr;
  cd.dispatch(x, rc, cp, cx, cpr);
  gd.dispatch(x.to(Device::cuda()), rg, gp, gx, gpr);
  ASSERT_EQ(gp.tokens_per_expert, cp.tokens_per_expert);
  ASSERT_EQ(gp.R, cp.R);
  EXPECT_TRUE(same_bits(gx, cx)) << "dispatched rows differ";
  EXPECT_TRUE(same_bits(gpr, cpr)) << "dispatched probabilities differ";
  const Tensor y = dispatch_values({cp.R, H}, seed + 6), dy = dispatch_values({T, H}, seed + 7);
  EXPECT_TRUE(same_bits(gd.combine(y.to(Device::cuda()), gp), cd.combine(y, cp))) << "combine differs";
  EXPECT_TRUE(same_bits(gd.combine_backward(dy.to(Device::cuda()), gp), cd.combine_backward(dy, cp)))
      << "combine_backward differs";
  const Tensor dp = dispatch_values({cp.R}, seed + 8);
  Tensor cdx, cdp, gdx, gdp;
  cd.dispatch_backward(y, dp, cp, DType::F32, cdx, cdp);
  gd.dispatch_backward(y.to(Device::cuda()), dp.to(Device::cuda()), gp, DType::F32, gdx, gdp);
  EXPECT_TRUE(same_bits(gdx, cdx)) << "dispatch_backward dx differs";
  EXPECT_TRUE(same_bits(gdp, cdp)) << "dispatch_backward dprobs differs";
}

TEST(GpuDispatch, AllToAllMatchesTheHostDispatcher) {
  MOE_REQUIRE_GPU();
  compare<moe::AllToAllTokenDispatcher>("alltoall");
}

TEST(GpuDispatch, AllGatherMatchesTheHostDispatcher) {
  MOE_REQUIRE_GPU();
  compare<moe::AllGatherTokenDispatcher>("allgather");
}

TEST(GpuDispatch, ExpertTensorParallelMatchesTheHost) {
  MOE_REQUIRE_GPU();
  const comm::ProcessGroup w = comm::ProcessGroup::world();
  const int64_t n = 3, H = 12, r = w.rank();
  const std::vector<int64_t> counts = {r + 1, 0, 2 * r + 3};
  const int64_t R = std::accumulate(counts.begin(), counts.end(), int64_t{0});
  const Tensor x = dispatch_values({R, H}, 50 + static_cast<uint64_t>(r)),
               p = dispatch_values({R}, 60 + static_cast<uint64_t>(r));
  moe::ExpertTensorParallel etp(w, n);
  moe::EtpPlan cp, gp;
  Tensor cx, cpr, gx, gpr;
  etp.gather(x, p, counts, cp, cx, cpr);
  etp.gather(x.to(Device::cuda()), p.to(Device::cuda()), counts, gp, gx, gpr);
  ASSERT_EQ(gp.tokens_per_expert, cp.tokens_per_expert);
  EXPECT_TRUE(same_bits(gx, cx)) << "gathered rows differ";
  EXPECT_TRUE(same_bits(gpr, cpr)) << "gathered probabilities differ";
  const Tensor part = dispatch_values({cx.rows(), H}, 70 + static_cast<uint64_t>(r));
  EXPECT_TRUE(same_bits(etp.reduce_scatter(part.to(Device::cuda()), gp), etp.reduce_scatter(part, cp)))
      << "reduce-scattered partial sums differ";
}

}  // namespace
}  // namespace moecore
