// The expert-parallel dispatchers (AlltoAll, AllGather) and expert tensor parallelism with GPU tensors, against the
// same classes on host tensors, under mpirun with every rank on GPU 0 (MPI traffic is host-staged, so ranks can
// share one GPU). Each test skips where no GPU is visible, so the CPU-only CTest runs pass them.
// The lead's GPU run: mpirun -np 2 moecore_mpi_tests --gtest_filter='GpuDispatch.*'
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <vector>

#include "cuda/gpu_util.h"
#include "moecore/comm/process_group.h"
#include "moecore/moe/expert_tensor_parallel.h"
#include "moecore/moe/token_dispatcher.h"

namespace moecore {
namespace {

Tensor rnd(const Shape& s, uint64_t seed) {
  Tensor t = Tensor::empty(s, DType::F32);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 7;
  for (int64_t i = 0; i < t.numel(); i++) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    t.set_item(i, static_cast<double>(x >> 40) / static_cast<double>(1 << 24) * 2 - 1);
  }
  return t;
}

moe::RoutedTokens routing(int64_t T, int64_t K, int64_t E, uint64_t seed) {
  moe::RoutedTokens r;
  r.idx_TK = Tensor::empty({T, K}, DType::I32);
  r.probs_TK = rnd({T, K}, seed + 1);
  uint64_t x = seed + 3;
  std::vector<int32_t> perm(static_cast<size_t>(E));
  for (int64_t t = 0; t < T; t++) {
    std::iota(perm.begin(), perm.end(), 0);
    for (int64_t i = E - 1; i > 0; i--) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      std::swap(perm[static_cast<size_t>(i)], perm[(x >> 33) % static_cast<uint64_t>(i + 1)]);
    }
    for (int64_t j = 0; j < K; j++) {
      const bool drop = (t + j) % 7 == 3;
      r.idx_TK.data<int32_t>()[t * K + j] = drop ? -1 : perm[static_cast<size_t>(j)];
      if (drop) r.probs_TK.set_item(t * K + j, 0.0);
    }
  }
  return r;
}

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
  const moe::RoutedTokens rc = routing(T, K, E, seed);
  const moe::RoutedTokens rg{rc.idx_TK.to(Device::cuda()), rc.probs_TK.to(Device::cuda()), 0};
  const Tensor x = rnd({T, H}, seed + 5);
  Dispatcher cd(w, E), gd(w, E);
  moe::DispatchPlan cp, gp;
  Tensor cx, cpr, gx, gpr;
  cd.dispatch(x, rc, cp, cx, cpr);
  gd.dispatch(x.to(Device::cuda()), rg, gp, gx, gpr);
  ASSERT_EQ(gp.tokens_per_expert, cp.tokens_per_expert);
  ASSERT_EQ(gp.R, cp.R);
  EXPECT_TRUE(same_bits(gx, cx)) << "dispatched rows differ";
  EXPECT_TRUE(same_bits(gpr, cpr)) << "dispatched probabilities differ";
  const Tensor y = rnd({cp.R, H}, seed + 6), dy = rnd({T, H}, seed + 7);
  EXPECT_TRUE(same_bits(gd.combine(y.to(Device::cuda()), gp), cd.combine(y, cp))) << "combine differs";
  EXPECT_TRUE(same_bits(gd.combine_backward(dy.to(Device::cuda()), gp), cd.combine_backward(dy, cp)))
      << "combine_backward differs";
  const Tensor dp = rnd({cp.R}, seed + 8);
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
  const Tensor x = rnd({R, H}, 50 + static_cast<uint64_t>(r)), p = rnd({R}, 60 + static_cast<uint64_t>(r));
  moe::ExpertTensorParallel etp(w, n);
  moe::EtpPlan cp, gp;
  Tensor cx, cpr, gx, gpr;
  etp.gather(x, p, counts, cp, cx, cpr);
  etp.gather(x.to(Device::cuda()), p.to(Device::cuda()), counts, gp, gx, gpr);
  ASSERT_EQ(gp.tokens_per_expert, cp.tokens_per_expert);
  EXPECT_TRUE(same_bits(gx, cx)) << "gathered rows differ";
  EXPECT_TRUE(same_bits(gpr, cpr)) << "gathered probabilities differ";
  const Tensor part = rnd({cx.rows(), H}, 70 + static_cast<uint64_t>(r));
  EXPECT_TRUE(same_bits(etp.reduce_scatter(part.to(Device::cuda()), gp), etp.reduce_scatter(part, cp)))
      << "reduce-scattered partial sums differ";
}

}  // namespace
}  // namespace moecore
