// The flex token dispatcher (moe/flex_dispatcher.h, --moe-token-dispatcher-type flex) under mpirun (2 and 4 ranks):
// the experts' rows, probabilities and counts are the AlltoAll dispatcher's bit for bit, combine and its adjoints
// agree with AlltoAll's to f32 summation order, each token crosses to a rank once (the bytes are the analytic count
// of distinct (token, destination rank) pairs; AlltoAll's, the kept assignments), the dispatch/combine pair's
// gradients pass an fp64 finite-difference check at EP2, and training with flex gives AlltoAll's losses within 1e-6
// and repeats bitwise, with top-k 1, 2 and 8, capacity dropping, padding to capacity, and bf16 with the EP overlap.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <set>
#include <vector>

#include "config_util.h"
#include "layout_util.h"
#include "moecore/comm/process_group.h"
#include "moecore/moe/flex_dispatcher.h"
#include "moecore/train/trainer.h"
#include "test_util.h"

namespace moecore {
namespace {

using testing::operator+;

Tensor rnd(const Shape& s, uint64_t seed, DType dt = DType::F32) {
  Tensor t = Tensor::empty(s, dt);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 7;
  for (int64_t i = 0; i < t.numel(); i++) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    t.set_item(i, static_cast<double>(x >> 40) / static_cast<double>(1 << 24) * 2 - 1);
  }
  return t;
}

// Top-K distinct experts per token, some assignments dropped (−1, probability 0).
moe::RoutedTokens routing(int64_t T, int64_t K, int64_t E, uint64_t seed, DType probs_t = DType::F32) {
  moe::RoutedTokens r;
  r.idx_TK = Tensor::empty({T, K}, DType::I32);
  r.probs_TK = rnd({T, K}, seed + 1, probs_t);
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

void expect_close(const Tensor& a, const Tensor& b, double rel, const char* what) {
  ASSERT_EQ(a.numel(), b.numel()) << what;
  for (int64_t i = 0; i < a.numel(); i++)
    ASSERT_NEAR(a.item(i), b.item(i), rel * (1 + std::fabs(b.item(i)))) << what << " element " << i;
}

struct Case {
  int64_t K, row_align, pad_capacity;
};

// Flex against AlltoAll on the same routing: the experts' rows and probabilities bit for bit, combine and the
// backward passes to summation order, and the token bytes each sends.
TEST(FlexDispatch, SameRowsAsAllToAllAndOneRowPerDestination) {
  const comm::ProcessGroup w = comm::ProcessGroup::world();
  const int64_t P = w.size(), T = 40, H = 12, E = 4 * P, n_local = E / P;
  for (const Case c :
       {Case{1, 1, 0}, Case{2, 1, 0}, Case{2, 4, 0}, Case{8, 1, 0}, Case{8, 4, 0}, Case{2, 1, 20}, Case{2, 4, 20}}) {
    SCOPED_TRACE(::testing::Message() << "K=" << c.K << " row_align=" << c.row_align << " pad=" << c.pad_capacity);
    const uint64_t seed = 100 + static_cast<uint64_t>(w.rank()) * 17 + static_cast<uint64_t>(c.K);
    moe::RoutedTokens r = routing(T, c.K, E, seed);
    r.pad_capacity = c.pad_capacity;
    const Tensor x = rnd({T, H}, seed + 5);
    moe::AllToAllTokenDispatcher a2a(w, E);
    moe::FlexTokenDispatcher flex(w, E);
    moe::DispatchPlan pa, pf;
    pa.row_align = pf.row_align = c.row_align;
    Tensor xa, pra, xf, prf;
    a2a.dispatch(x, r, pa, xa, pra);
    flex.dispatch(x, r, pf, xf, prf);
    ASSERT_EQ(pf.tokens_per_expert, pa.tokens_per_expert);
    ASSERT_EQ(pf.R, pa.R);
    EXPECT_TRUE(testing::bitwise_equal(xf, xa)) << "the experts' rows differ";
    EXPECT_TRUE(testing::bitwise_equal(prf, pra)) << "the experts' probabilities differ";
    // Bytes: AlltoAll sends one row per kept assignment (and padding row); flex one per distinct (token, rank).
    int64_t assignments = 0, distinct = 0;
    for (int64_t t = 0; t < T; t++) {
      std::set<int64_t> ranks;
      for (int64_t j = 0; j < c.K; j++) {
        const int32_t e = r.idx_TK.data<int32_t>()[t * c.K + j];
        if (e >= 0) assignments++, ranks.insert(e / n_local);
      }
      distinct += static_cast<int64_t>(ranks.size());
    }
    if (c.pad_capacity == 0) {
      EXPECT_EQ(pa.local_rows, assignments);
      EXPECT_EQ(pf.send_token.numel(), distinct);
    } else {
      EXPECT_EQ(pa.local_rows, E * c.pad_capacity);  // every expert gets pad_capacity rows from this rank
      EXPECT_LE(pf.send_token.numel(), pa.local_rows);
    }
    // Combine and the adjoints.
    const Tensor y = rnd({pa.R, H}, seed + 6), dy = rnd({T, H}, seed + 7), dp = rnd({pa.R}, seed + 8);
    expect_close(flex.combine(y, pf), a2a.combine(y, pa), 1e-6, "combine");
    EXPECT_TRUE(testing::bitwise_equal(flex.combine_backward(dy, pf), a2a.combine_backward(dy, pa)))
        << "combine_backward differs";
    Tensor dxa, dpa, dxf, dpf;
    a2a.dispatch_backward(y, dp, pa, DType::F32, dxa, dpa);
    flex.dispatch_backward(y, dp, pf, DType::F32, dxf, dpf);
    expect_close(dxf, dxa, 1e-6, "dispatch_backward dx");
    EXPECT_TRUE(testing::bitwise_equal(dpf, dpa)) << "dispatch_backward dprobs differ";
    // The split backward (start/finish) is the same bits.
    moe::TokenDispatcher::PendingBackward pend;
    Tensor dx2, dp2;
    flex.dispatch_backward_start(y, dp, pf, pend);
    flex.dispatch_backward_finish(pend, pf, DType::F32, dx2, dp2);
    EXPECT_TRUE(testing::bitwise_equal(dx2, dxf) && testing::bitwise_equal(dp2, dpf));
  }
}

// The dispatch/combine pair in f64 at EP2 with an expert step y = p·x² between them: the tokens' and the
// probabilities' gradients against central differences of the loss summed over ranks (one rank perturbs at a time).
TEST(FlexDispatch, GradientsMatchFiniteDifferencesAtEP2) {
  const comm::ProcessGroup w = comm::ProcessGroup::world();
  if (w.size() != 2) GTEST_SKIP() << "EP2 runs on 2 ranks";
  const int64_t T = 10, H = 3, K = 2, E = 4;
  const uint64_t seed = 7 + static_cast<uint64_t>(w.rank()) * 31;
  moe::RoutedTokens r = routing(T, K, E, seed, DType::F64);
  Tensor x = rnd({T, H}, seed + 2, DType::F64);
  const Tensor wt = rnd({T, H}, seed + 3, DType::F64);
  moe::FlexTokenDispatcher flex(w, E);
  auto loss = [&]() {
    moe::DispatchPlan plan;
    plan.row_align = 2;
    Tensor x_RH, p_R;
    flex.dispatch(x, r, plan, x_RH, p_R);
    Tensor y_RH = Tensor::empty(x_RH.shape(), DType::F64);
    for (int64_t i = 0; i < plan.R; i++)
      for (int64_t h = 0; h < H; h++) {
        const double v = x_RH.item(i * H + h);
        y_RH.set_item(i * H + h, p_R.item(i) * v * v);
      }
    const Tensor y = flex.combine(y_RH, plan);
    Tensor s = Tensor::zeros({1}, DType::F64);
    double acc = 0;
    for (int64_t i = 0; i < y.numel(); i++) acc += y.item(i) * wt.item(i);
    s.set_item(0, acc);
    w.all_reduce(s);
    return s.item(0);
  };
  // The analytic gradients through the adjoints.
  moe::DispatchPlan plan;
  plan.row_align = 2;
  Tensor x_RH, p_R;
  flex.dispatch(x, r, plan, x_RH, p_R);
  const Tensor dy_RH = flex.combine_backward(wt, plan);
  Tensor dx_RH = Tensor::zeros(x_RH.shape(), DType::F64), dp_R = Tensor::zeros({plan.R}, DType::F64);
  for (int64_t i = 0; i < plan.R; i++) {
    double dp = 0;
    for (int64_t h = 0; h < H; h++) {
      const double v = x_RH.item(i * H + h), g = dy_RH.item(i * H + h);
      dx_RH.set_item(i * H + h, 2 * p_R.item(i) * v * g);
      dp += v * v * g;
    }
    dp_R.set_item(i, dp);
  }
  Tensor dx, dprobs;
  flex.dispatch_backward(dx_RH, dp_R, plan, DType::F64, dx, dprobs);
  for (int64_t who = 0; who < w.size(); who++) {
    Tensor dummy_x = Tensor::zeros({T, H}, DType::F64), dummy_p = Tensor::zeros({T, K}, DType::F64);
    const bool me = w.rank() == who;
    const double ex = testing::fd_rel_error(loss, me ? x : dummy_x, dx);
    const double ep = testing::fd_rel_error(loss, me ? r.probs_TK : dummy_p, dprobs);
    if (me) {
      EXPECT_LT(ex, 1e-7) << "rank " << who << " token gradient";
      EXPECT_LT(ep, 1e-7) << "rank " << who << " probability gradient";
    }
  }
}

// Training: flex (both backends) against alltoall, EP over every rank, top-k 1, 2, 8 of 8 experts, dropless,
// capacity-dropped and padded to capacity.
struct TrainCase {
  const char* name;
  std::vector<std::string> flags;
};

class FlexTraining : public ::testing::TestWithParam<TrainCase> {};

TEST_P(FlexTraining, MatchesAllToAllAndRepeatsBitwise) {
  const comm::ProcessGroup w = comm::ProcessGroup::world();
  const std::vector<std::string> base =
      train::override_flags(testing::tiny_moe_flags(), {"--num-experts", "8"}) +
      testing::mock_run_flags(32, 2, 2 * w.size(), 128, 4, "1e-3") +
      std::vector<std::string>{"--expert-model-parallel-size", std::to_string(w.size()), "--moe-aux-loss-coeff",
                               "1e-2"} +
      GetParam().flags;
  const train::TrainConfig a2a = testing::small_config(base, {"--moe-token-dispatcher-type", "alltoall"});
  const std::vector<std::string> flex = {"--moe-token-dispatcher-type", "flex", "--moe-flex-dispatcher-backend",
                                         "hybridep"};
  std::FILE* null = std::fopen("/dev/null", "w");
  {
    train::Trainer ra(a2a, null, false, &w), rf(testing::small_config(base, flex), null, false, &w),
        rf2(testing::small_config(base, flex), null, false, &w);
    for (int step = 0; step < 4; step++) {
      const train::StepResult sa = ra.train_step(), sf = rf.train_step(), sf2 = rf2.train_step();
      testing::expect_same_step(sa, sf, step, 1e-6);
      EXPECT_EQ(sf.lm_loss, sf2.lm_loss) << "step " << step;
      EXPECT_EQ(sf.grad_norm, sf2.grad_norm) << "step " << step;
    }
  }
  std::fclose(null);
}

INSTANTIATE_TEST_SUITE_P(
    Flex, FlexTraining,
    ::testing::Values(
        TrainCase{"top1", {"--moe-router-topk", "1", "--moe-router-pre-softmax"}},
        TrainCase{"top2", {"--moe-router-topk", "2"}}, TrainCase{"top8", {"--moe-router-topk", "8"}},
        TrainCase{"top2_capacity_drop", {"--moe-router-topk", "2", "--moe-expert-capacity-factor", "1.0"}},
        TrainCase{
            "top2_position_drop",
            {"--moe-router-topk", "2", "--moe-expert-capacity-factor", "0.5", "--moe-token-drop-policy", "position"}},
        TrainCase{
            "top2_pad_to_capacity",
            {"--moe-router-topk", "2", "--moe-expert-capacity-factor", "1.0", "--moe-pad-expert-input-to-capacity"}},
        TrainCase{"top2_bf16_overlap",
                  {"--moe-router-topk", "2", "--bf16", "--overlap-moe-expert-parallel-comm", "--delay-wgrad-compute"}},
        TrainCase{"top8_capacity_drop", {"--moe-router-topk", "8", "--moe-expert-capacity-factor", "0.5"}}),
    [](const ::testing::TestParamInfo<TrainCase>& i) { return std::string(i.param.name); });

// EP2 × ETP2 on 4 ranks: the flex exchange over EP, then the ETP stage, as AlltoAll's.
TEST(FlexTraining, WithExpertTensorParallelismMatchesAllToAll) {
  const comm::ProcessGroup w = comm::ProcessGroup::world();
  if (w.size() != 4) GTEST_SKIP() << "EP2 x ETP2 runs on 4 ranks";
  const std::vector<std::string> base =
      train::override_flags(testing::tiny_moe_flags(), {"--num-experts", "8"}) +
      testing::mock_run_flags(32, 2, 8, 128, 3, "1e-3") +
      std::vector<std::string>{
          "--expert-model-parallel-size", "2", "--expert-tensor-parallel-size", "2", "--moe-router-topk", "4"};
  std::FILE* null = std::fopen("/dev/null", "w");
  {
    train::Trainer a(testing::small_config(base, {"--moe-token-dispatcher-type", "alltoall"}), null, false, &w),
        f(testing::small_config(base, {"--moe-token-dispatcher-type", "flex"}), null, false, &w);
    for (int step = 0; step < 3; step++) testing::expect_same_step(a.train_step(), f.train_step(), step, 1e-6);
  }
  std::fclose(null);
}

// deepep and hybridep (and --moe-enable-deepep) are the same math: bitwise-equal losses.
TEST(FlexTraining, BackendsAgreeBitwise) {
  const comm::ProcessGroup w = comm::ProcessGroup::world();
  const std::vector<std::string> base =
      train::override_flags(testing::tiny_moe_flags(), {"--num-experts", "8"}) +
      testing::mock_run_flags(32, 2, 2 * w.size(), 128, 3, "1e-3") +
      std::vector<std::string>{"--expert-model-parallel-size", std::to_string(w.size()), "--moe-token-dispatcher-type",
                               "flex"};
  std::FILE* null = std::fopen("/dev/null", "w");
  {
    train::Trainer d(testing::small_config(base, {"--moe-flex-dispatcher-backend", "deepep"}), null, false, &w),
        h(testing::small_config(base, {"--moe-flex-dispatcher-backend", "hybridep"}), null, false, &w),
        old(testing::small_config(base, {"--moe-enable-deepep"}), null, false, &w);
    for (int step = 0; step < 3; step++) {
      const train::StepResult a = d.train_step(), b = h.train_step(), c = old.train_step();
      EXPECT_EQ(a.lm_loss, b.lm_loss);
      EXPECT_EQ(a.lm_loss, c.lm_loss);
      EXPECT_EQ(a.grad_norm, b.grad_norm);
    }
  }
  std::fclose(null);
}

}  // namespace
}  // namespace moecore
