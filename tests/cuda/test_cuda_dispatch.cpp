// The MoE token dispatcher on the GPU against the CPU dispatcher: the plan (rows expert-major, ascending token inside
// an expert; each token's rows in ascending expert order), permuted rows and probabilities, combine, and both
// backward passes, on random routings with dropped assignments (−1 ids) and with padding to capacity; and bitwise
// reruns. The permutation moves bytes, so rows and probabilities must equal the CPU's exactly; the per-token sums
// add in the CPU's order, so they are held to 1e-6 relative (and equal bits are expected).
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <vector>

#include "cuda/gpu_util.h"
#include "cuda/kernel_compare.h"
#include "moecore/moe/token_dispatcher.h"

namespace moecore {
namespace {

using testing_cuda::bitwise_equal;
using testing_cuda::gpu;
using testing_cuda::host_random;
using testing_cuda::rel_diff;

// K distinct experts per token from a seeded shuffle; each assignment dropped (−1, probability 0) with drop_pct %.
moe::RoutedTokens random_routing(int64_t T, int64_t K, int64_t E, int drop_pct, uint64_t seed) {
  moe::RoutedTokens r;
  r.idx_TK = Tensor::empty({T, K}, DType::I32);
  r.probs_TK = host_random({T, K}, seed + 1, 1.0);
  uint64_t x = seed * 6364136223846793005ull + 1442695040888963407ull;
  auto next = [&] {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    return x >> 33;
  };
  std::vector<int32_t> perm(static_cast<size_t>(E));
  for (int64_t t = 0; t < T; t++) {
    std::iota(perm.begin(), perm.end(), 0);
    for (int64_t i = E - 1; i > 0; i--) std::swap(perm[i], perm[next() % (i + 1)]);
    for (int64_t j = 0; j < K; j++) {
      const bool drop = static_cast<int>(next() % 100) < drop_pct;
      r.idx_TK.data<int32_t>()[t * K + j] = drop ? -1 : perm[j];
      if (drop) r.probs_TK.set_item(t * K + j, 0.0);
    }
  }
  return r;
}

bool host_equal(const Tensor& got_gpu, const Tensor& want) {
  return bitwise_equal(got_gpu, want.to(Device::cuda()));
}

struct Case {
  int64_t T, K, E, H;
  int drop_pct;
  int64_t pad_capacity;
};

void compare_with_cpu(const Case& c, uint64_t seed) {
  SCOPED_TRACE(::testing::Message() << "T=" << c.T << " K=" << c.K << " E=" << c.E << " H=" << c.H
                                    << " drop%=" << c.drop_pct << " pad=" << c.pad_capacity);
  moe::RoutedTokens cpu_r = random_routing(c.T, c.K, c.E, c.drop_pct, seed);
  cpu_r.pad_capacity = c.pad_capacity;
  moe::RoutedTokens gpu_r{gpu(cpu_r.idx_TK), gpu(cpu_r.probs_TK), c.pad_capacity};
  const Tensor x = host_random({c.T, c.H}, seed + 2);
  moe::LocalTokenDispatcher cpu_d(c.E), gpu_d(c.E);
  moe::DispatchPlan cp, gp;
  Tensor cx, cprobs, gx, gprobs;
  cpu_d.dispatch(x, cpu_r, cp, cx, cprobs);
  gpu_d.dispatch(gpu(x), gpu_r, gp, gx, gprobs);
  ASSERT_EQ(gp.tokens_per_expert, cp.tokens_per_expert);
  ASSERT_EQ(gp.R, cp.R);
  EXPECT_TRUE(gx.device().is_cuda() && gp.row_token_R.device().is_cuda() && gp.token_rows.device().is_cuda());
  EXPECT_TRUE(host_equal(gp.row_token_R, cp.row_token_R)) << "row_token_R differs from the CPU plan";
  EXPECT_TRUE(host_equal(gp.row_tk_R, cp.row_tk_R)) << "row_tk_R differs from the CPU plan";
  EXPECT_TRUE(host_equal(gp.token_offsets_T1, cp.token_offsets_T1)) << "token_offsets differ from the CPU plan";
  EXPECT_TRUE(host_equal(gp.token_rows, cp.token_rows)) << "token_rows differ from the CPU plan";
  EXPECT_TRUE(host_equal(gx, cx)) << "permuted rows differ: rel " << rel_diff(gx, cx);
  EXPECT_TRUE(host_equal(gprobs, cprobs)) << "permuted probabilities differ: rel " << rel_diff(gprobs, cprobs);
  // combine and its backward
  const Tensor y = host_random({cp.R, c.H}, seed + 3);
  const Tensor cy = cpu_d.combine(y, cp), gy = gpu_d.combine(gpu(y), gp);
  EXPECT_LE(rel_diff(gy, cy), 1e-6) << "combine";
  EXPECT_TRUE(host_equal(gy, cy)) << "combine is not the CPU's bits: rel " << rel_diff(gy, cy);
  const Tensor dy = host_random({c.T, c.H}, seed + 4);
  const Tensor cdy = cpu_d.combine_backward(dy, cp), gdy = gpu_d.combine_backward(gpu(dy), gp);
  EXPECT_TRUE(host_equal(gdy, cdy)) << "combine_backward: rel " << rel_diff(gdy, cdy);
  // dispatch backward
  const Tensor dx = host_random({cp.R, c.H}, seed + 5), dp = host_random({cp.R}, seed + 6);
  Tensor cdx, cdp, gdx, gdp;
  cpu_d.dispatch_backward(dx, dp, cp, DType::F32, cdx, cdp);
  gpu_d.dispatch_backward(gpu(dx), gpu(dp), gp, DType::F32, gdx, gdp);
  EXPECT_LE(rel_diff(gdx, cdx), 1e-6) << "dispatch_backward dx_TH";
  EXPECT_TRUE(host_equal(gdx, cdx)) << "dispatch_backward dx_TH is not the CPU's bits: rel " << rel_diff(gdx, cdx);
  EXPECT_TRUE(host_equal(gdp, cdp)) << "dispatch_backward dprobs_TK: rel " << rel_diff(gdp, cdp);
  // bf16 rows permute by bytes as well
  const Tensor xb = x.to(DType::BF16);
  moe::DispatchPlan cpb, gpb;
  Tensor cxb, cpbp, gxb, gpbp;
  cpu_d.dispatch(xb, cpu_r, cpb, cxb, cpbp);
  gpu_d.dispatch(gpu(xb), gpu_r, gpb, gxb, gpbp);
  EXPECT_TRUE(host_equal(gxb, cxb)) << "bf16 permuted rows differ";
  EXPECT_TRUE(host_equal(gpbp, cpbp)) << "probabilities beside bf16 rows differ";
}

TEST(CudaDispatch, PermuteCombineAndBackwardsMatchTheCpu) {
  MOE_REQUIRE_GPU();
  const Case cases[] = {
      {37, 2, 5, 24, 10, 0},   // 16-byte rows, some drops
      {64, 4, 16, 13, 0, 0},   // odd width: 4-byte words
      {50, 3, 8, 40, 60, 0},   // many drops: experts with no rows
      {1, 1, 3, 8, 0, 0},      // one token
      {33, 2, 4, 16, 100, 0},  // everything dropped: R = 0
      {129, 8, 64, 72, 5, 0},
  };
  uint64_t seed = 100;
  for (const Case& c : cases) compare_with_cpu(c, seed += 10);
}

TEST(CudaDispatch, PaddingToCapacityMatchesTheCpu) {
  MOE_REQUIRE_GPU();
  // pad_capacity ≥ any expert's kept rows: drop enough that no expert exceeds it.
  compare_with_cpu({24, 2, 4, 16, 50, 24}, 7);
  compare_with_cpu({40, 3, 6, 20, 20, 40}, 8);
}

TEST(CudaDispatch, RerunsAreBitwise) {
  MOE_REQUIRE_GPU();
  const int64_t T = 4096, K = 8, E = 64, H = 256;
  const moe::RoutedTokens r0 = random_routing(T, K, E, 3, 42);
  const moe::RoutedTokens r{gpu(r0.idx_TK), gpu(r0.probs_TK), 0};
  const Tensor x = gpu(host_random({T, H}, 43));
  moe::LocalTokenDispatcher d(E);
  Tensor out[2][6];
  for (int run = 0; run < 2; run++) {
    moe::DispatchPlan p;
    Tensor xr, pr;
    d.dispatch(x, r, p, xr, pr);
    const Tensor y = gpu(host_random({p.R, H}, 44));
    Tensor dx, dp;
    d.dispatch_backward(y, pr, p, DType::F32, dx, dp);
    out[run][0] = xr, out[run][1] = pr, out[run][2] = d.combine(y, p), out[run][3] = dx, out[run][4] = dp;
    out[run][5] = p.token_rows;
  }
  const char* names[] = {"x_RH", "probs_R", "combine", "dx_TH", "dprobs_TK", "token_rows"};
  for (int i = 0; i < 6; i++) EXPECT_TRUE(bitwise_equal(out[0][i], out[1][i])) << names[i] << " differs on rerun";
}

}  // namespace
}  // namespace moecore
