// Layout invariance over MPI ranks: a tiny MoE model trained data-parallel gives the single-rank run's per-step lm
// loss, aux losses and grad norm within 1e-5 relative (f32).
#include <gtest/gtest.h>

#include <cmath>
#include <tuple>

#include "moecore/comm/process_group.h"
#include "moecore/train/trainer.h"

namespace moecore {
namespace {

// Every layout this world size allows (DP over all ranks; EP 2 and 4 folded over the data-parallel ranks).
class Layouts : public ::testing::TestWithParam<std::tuple<int64_t, std::string, bool>> {};

TEST_P(Layouts, MatchSingleRank) {
  const comm::ProcessGroup w = comm::ProcessGroup::world();
  const int64_t ep = std::get<0>(GetParam());
  if (w.size() % ep != 0) GTEST_SKIP() << "EP" << ep << " needs a multiple of " << ep << " ranks";
  std::vector<std::string> args{
      "--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--swiglu", "--disable-bias-linear",
      "--num-experts", "4", "--moe-router-topk", "2", "--moe-ffn-hidden-size", "64", "--moe-router-score-function",
      "sigmoid", "--moe-router-enable-expert-bias", "--moe-router-load-balancing-type", "aux_loss", "seq_aux_loss",
      "--moe-aux-loss-coeff", "1e-2", "1e-3", "--moe-z-loss-coeff", "1e-3", "--seq-length", "32",
      "--micro-batch-size", "2", "--global-batch-size", "8", "--mock-data", "--vocab-size", "128", "--train-iters",
      "5", "--lr", "1e-3", "--eval-iters", "0"};
  const train::TrainConfig one = train::parse_train_config(args);
  args.insert(args.end(), {"--expert-model-parallel-size", std::to_string(ep), "--moe-token-dispatcher-type",
                           std::get<1>(GetParam())});
  if (std::get<2>(GetParam())) args.push_back("--use-distributed-optimizer");
  const train::TrainConfig cfg = train::parse_train_config(args);
  std::FILE* null = std::fopen("/dev/null", "w");
  train::Trainer single(one, null, false, nullptr), multi(cfg, null, false, &w);
  for (int step = 0; step < 5; step++) {
    const auto a = single.train_step(), b = multi.train_step();
    EXPECT_NEAR(b.lm_loss, a.lm_loss, 1e-5 * std::fabs(a.lm_loss)) << "step " << step;
    EXPECT_NEAR(b.grad_norm, a.grad_norm, 1e-5 * a.grad_norm) << "step " << step;
    ASSERT_EQ(a.aux_losses.size(), b.aux_losses.size());
    for (size_t t = 0; t < a.aux_losses.size(); t++)
      EXPECT_NEAR(b.aux_losses[t], a.aux_losses[t], 1e-5 * std::fabs(a.aux_losses[t])) << "step " << step;
    EXPECT_NEAR(b.z_loss, a.z_loss, 1e-5 * std::fabs(a.z_loss)) << "step " << step;
  }
  std::fclose(null);
}

INSTANTIATE_TEST_SUITE_P(EP, Layouts,
                         ::testing::Combine(::testing::Values(1, 2, 4), ::testing::Values("alltoall", "allgather"),
                                            ::testing::Values(false, true)));

}  // namespace
}  // namespace moecore
