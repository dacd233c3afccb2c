// Layout invariance over MPI ranks: a tiny MoE model trained under data, expert, tensor (+ sequence) and
// expert-tensor parallelism gives the single-rank run's per-step lm loss, aux losses and grad norm within 1e-5
// relative (f32).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <tuple>

#include "config_util.h"
#include "layout_util.h"
#include "moecore/comm/process_group.h"
#include "moecore/core/rng.h"
#include "moecore/moe/moe_layer.h"
#include "moecore/train/trainer.h"

namespace moecore {
namespace {

using testing::operator+;

using testing::expect_same_steps;

// Every layout this world size allows (DP over all ranks; EP 2 and 4 folded over the data-parallel ranks).
class Layouts : public ::testing::TestWithParam<std::tuple<int64_t, std::string, bool>> {};

TEST_P(Layouts, MatchSingleRank) {
  const comm::ProcessGroup w = comm::ProcessGroup::world();
  const int64_t ep = std::get<0>(GetParam());
  if (w.size() % ep != 0) GTEST_SKIP() << "EP" << ep << " needs a multiple of " << ep << " ranks";
  std::vector<std::string> args =
      train::override_flags(testing::tiny_moe_flags(), {"--hidden-size", "64", "--moe-ffn-hidden-size", "64"}) +
      std::vector<std::string>{"--moe-router-score-function",
                               "sigmoid",
                               "--moe-router-enable-expert-bias",
                               "--moe-router-load-balancing-type",
                               "aux_loss",
                               "seq_aux_loss",
                               "--moe-aux-loss-coeff",
                               "1e-2",
                               "1e-3",
                               "--moe-z-loss-coeff",
                               "1e-3"} +
      testing::mock_run_flags(32, 2, 8, 128, 5, "1e-3");
  const train::TrainConfig one = testing::small_config(args);
  args.insert(args.end(), {"--expert-model-parallel-size", std::to_string(ep), "--moe-token-dispatcher-type",
                           std::get<1>(GetParam())});
  if (std::get<2>(GetParam())) args.push_back("--use-distributed-optimizer");
  expect_same_steps(one, testing::small_config(args), w);
}

INSTANTIATE_TEST_SUITE_P(EP, Layouts,
                         ::testing::Combine(::testing::Values(1, 2, 4), ::testing::Values("alltoall", "allgather"),
                                            ::testing::Values(false, true)));

// The two expert-parallel dispatchers route the same rows to the same experts: one MoE layer with experts spread
// over every rank gives the same outputs, input gradients and expert gradients (to f32 summation order) with
// alltoall and allgather.
TEST(Dispatchers, AllGatherAndAllToAllGiveTheSameLayer) {
  const comm::ProcessGroup w = comm::ProcessGroup::world();
  const int64_t H = 16, E = 2 * w.size(), S = 8, B = 2;
  auto run = [&](bool allgather, Tensor& y, Tensor& dx, Tensor& dw1) {
    moe::MoELayerConfig c;
    c.router.hidden = H;
    c.router.num_experts = E;
    c.router.topk = 2;
    c.router.aux_loss_coeff = {1e-2};
    c.ffn_hidden = 12;
    c.ep_group = &w;
    c.allgather_dispatcher = allgather;
    nn::ParamRegistry reg;
    moe::MoELayer layer(reg, "mlp", c);
    reg.initialize(7);
    Tensor x = Tensor::empty({S, B, H}, DType::F32), dy = Tensor::empty({S, B, H}, DType::F32);
    const Philox rng(11 + static_cast<uint64_t>(w.rank()), 3);  // each rank its own tokens
    for (int64_t i = 0; i < x.numel(); i++) {
      x.set_item(i, rng.normal(static_cast<uint64_t>(i)));
      dy.set_item(i, rng.normal(static_cast<uint64_t>(i + x.numel())));
    }
    auto st = layer.make_stash();
    y = layer.forward(x, *st).clone();
    dx = layer.backward(dy, *st).clone();
    dw1 = layer.experts().fc1().grad.clone();
  };
  Tensor y1, dx1, g1, y2, dx2, g2;
  run(false, y1, dx1, g1);
  run(true, y2, dx2, g2);
  for (auto [a, b] : {std::pair{&y1, &y2}, {&dx1, &dx2}, {&g1, &g2}})
    for (int64_t i = 0; i < a->numel(); i++) EXPECT_NEAR(a->item(i), b->item(i), 1e-5 * (1 + std::fabs(a->item(i))));
}

// Model-parallel layouts on a model that exercises every split: grouped-query attention with qk-norm, untied
// output layer, shared experts with a gate, a dense first layer, sequence-aux and z losses.
struct ModelParallel {
  std::string name;
  int64_t world;  // ranks the layout needs (run on that world size only)
  std::vector<std::string> flags;
  std::vector<std::string> both = {};    // flags for the single-rank run too
  std::vector<std::string> single = {};  // flags for the single-rank run only
};

class ModelParallelLayouts : public ::testing::TestWithParam<ModelParallel> {};

TEST_P(ModelParallelLayouts, MatchSingleRank) {
  const comm::ProcessGroup w = comm::ProcessGroup::world();
  const ModelParallel& l = GetParam();
  if (w.size() != l.world) GTEST_SKIP() << l.name << " runs on " << l.world << " ranks";
  std::vector<std::string> args =
      train::override_flags(testing::layered_moe_flags(), {"--moe-router-load-balancing-type", "aux_loss",
                                                           "seq_aux_loss", "--moe-aux-loss-coeff", "1e-2", "1e-3"}) +
      testing::mock_run_flags(32, 2, 8, 120, 5, "1e-3") +
      std::vector<std::string>{"--make-vocab-size-divisible-by", "64"};
  args = train::override_flags(args, l.both);
  const train::TrainConfig one = testing::small_config(args, l.single);
  expect_same_steps(one, testing::small_config(args, l.flags), w);
}

const std::vector<std::string> kLayoutsTP2{"--tensor-model-parallel-size", "2", "--sequence-parallel"};

INSTANTIATE_TEST_SUITE_P(
    Layouts, ModelParallelLayouts,
    ::testing::Values(
        ModelParallel{"TP2_SP", 2, kLayoutsTP2 + std::vector<std::string>{"--expert-tensor-parallel-size", "1"}},
        ModelParallel{"TP2_ETP2", 2, kLayoutsTP2}, ModelParallel{"ETP2", 2, {"--expert-tensor-parallel-size", "2"}},
        ModelParallel{"TP2_DP2_distopt", 4,
                      kLayoutsTP2 + std::vector<std::string>{"--expert-tensor-parallel-size", "1",
                                                             "--use-distributed-optimizer"}},
        ModelParallel{"TP2xEP2_folded", 4,
                      kLayoutsTP2 + std::vector<std::string>{"--expert-tensor-parallel-size", "1",
                                                             "--expert-model-parallel-size", "2"}},
        ModelParallel{"TP2xEP2xETP2_allgather", 4,
                      kLayoutsTP2 + std::vector<std::string>{"--expert-model-parallel-size", "2",
                                                             "--moe-token-dispatcher-type", "allgather"}},
        ModelParallel{"DP2xEP2xETP2", 4, kLayoutsTP2 + std::vector<std::string>{"--expert-model-parallel-size", "2"}},
        // global_aux_loss over the global batch: one micro-batch per rank against one micro-batch of all samples
        // on a single rank (with several micro-batches the running count mean depends on their order).
        ModelParallel{
            "GlobalAux_TP2xDP2",
            4,
            kLayoutsTP2 + std::vector<std::string>{"--expert-tensor-parallel-size", "1", "--micro-batch-size", "2"},
            {"--moe-router-load-balancing-type", "global_aux_loss", "--moe-aux-loss-coeff", "1e-2",
             "--global-batch-size", "4"},
            {"--micro-batch-size", "4"}},
        ModelParallel{"GlobalAux_DP2xEP2",
                      2,
                      {"--expert-model-parallel-size", "2", "--micro-batch-size", "2"},
                      {"--moe-router-load-balancing-type", "global_aux_loss", "--moe-aux-loss-coeff", "1e-2",
                       "--global-batch-size", "4"},
                      {"--micro-batch-size", "4"}},
        // Sinkhorn selection balances over every token of the micro-batch: its column sums span the TP group.
        ModelParallel{
            "Sinkhorn_top1_TP2xEP2",
            4,
            kLayoutsTP2 +
                std::vector<std::string>{"--expert-tensor-parallel-size", "1", "--expert-model-parallel-size", "2"},
            {"--moe-router-load-balancing-type", "sinkhorn", "--moe-aux-loss-coeff", "0", "--moe-router-topk", "1"}},
        ModelParallel{"Sinkhorn_top2_TP2_ETP2",
                      2,
                      kLayoutsTP2,
                      {"--moe-router-load-balancing-type", "sinkhorn", "--moe-aux-loss-coeff", "0"}},
        ModelParallel{"DP4xEP2xETP2_distopt",
                      4,
                      {"--expert-model-parallel-size", "2", "--expert-tensor-parallel-size", "2",
                       "--use-distributed-optimizer"}}),
    [](const ::testing::TestParamInfo<ModelParallel>& i) { return i.param.name; });

}  // namespace
}  // namespace moecore
