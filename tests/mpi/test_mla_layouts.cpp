// Layout invariance of Multi-Latent Attention: a tiny MoE model with MLA (q latent and latent norms, YaRN with both
// mscales, v_head_dim ≠ qk width) trained under TP2 with sequence parallelism (heads split, down projections
// replicated on sequence shards), EP2, TP2×EP2, DP, and context parallelism (CP2 p2p and a2a, CP4 allgather,
// CP2×TP2) gives the single-rank run's per-step losses and grad norms within 1e-5 relative; and without the q latent
// (a direct, column-parallel q projection) under TP2.
#include <gtest/gtest.h>

#include <map>

#include "config_util.h"
#include "layout_util.h"
#include "moecore/core/rng.h"
#include "moecore/nn/mla_attention.h"

namespace moecore {
namespace {

using testing::operator+;

struct MLALayout {
  std::string name;
  int64_t world;
  std::vector<std::string> flags;
  bool q_lora = true;
};

class MLALayouts : public ::testing::TestWithParam<MLALayout> {};

TEST_P(MLALayouts, MatchSingleRank) {
  const comm::ProcessGroup w = comm::ProcessGroup::world();
  const MLALayout& l = GetParam();
  if (w.size() != l.world) GTEST_SKIP() << l.name << " runs on " << l.world << " ranks";
  const std::vector<std::string> args = train::override_flags(testing::tiny_moe_flags(), {"--hidden-size", "64"}) +
                                        testing::small_mla_flags(l.q_lora) +
                                        testing::mock_run_flags(32, 2, 8, 120, 4, "1e-3") +
                                        std::vector<std::string>{"--make-vocab-size-divisible-by", "64"};
  testing::expect_same_steps(testing::small_config(args), testing::small_config(args, l.flags), w, 4);
}

// The module alone: under TP2 with sequence parallelism each rank's output shard and input-gradient shard equal
// the single-rank module's rows, and every parameter gradient (summed over TP for the replicated ones) its share.
TEST(MLAModule, TensorParallelShardsMatchOneRank) {
  const comm::ProcessGroup w = comm::ProcessGroup::world();
  if (w.size() != 2) GTEST_SKIP() << "runs on 2 ranks";
  const int64_t S = 8, B = 2, H = 16;
  auto run = [&](const comm::ProcessGroup* tp, Tensor& y, Tensor& dx, std::map<std::string, Tensor>& grads) {
    nn::AttentionConfig a;
    a.hidden = H, a.num_heads = 4, a.max_seq_len = 16, a.qk_layernorm = true, a.init_std = 0.3;
    a.tp.group = tp;
    nn::MLAConfig m;
    m.enabled = true, m.q_lora_rank = 12, m.kv_lora_rank = 10, m.qk_head_dim = 6, m.qk_pos_emb_head_dim = 4;
    m.v_head_dim = 8, m.yarn_params.scaling_factor = 4;
    nn::ParamRegistry reg;
    nn::MLAttention mla(reg, "attn", a, m);
    reg.initialize(7);
    reg.zero_grad();
    Tensor x = Tensor::empty({S, B, H}, DType::F32), dy = Tensor::empty({S, B, H}, DType::F32);
    const Philox rng(11, 3);
    for (int64_t i = 0; i < x.numel(); i++) {
      x.set_item(i, rng.normal(static_cast<uint64_t>(i)));
      dy.set_item(i, rng.normal(static_cast<uint64_t>(i + x.numel())));
    }
    const int64_t P = tp ? tp->size() : 1, r = tp ? tp->rank() : 0;
    nn::MLAttention::Stash st;
    y = mla.forward(x.slice(r * S / P, S / P).clone(), st).clone();
    dx = mla.backward(dy.slice(r * S / P, S / P).clone(), st).clone();
    for (auto& p : reg.all()) grads[p->name] = p->grad.clone();
  };
  Tensor y1, dx1, y2, dx2;
  std::map<std::string, Tensor> g1, g2;
  run(nullptr, y1, dx1, g1);
  run(&w, y2, dx2, g2);
  const int64_t rows = S / 2 * B * H, off = w.rank() * rows;
  for (int64_t i = 0; i < rows; i++) {
    EXPECT_NEAR(y2.item(i), y1.item(off + i), 1e-5) << "y " << i;
    EXPECT_NEAR(dx2.item(i), dx1.item(off + i), 1e-5) << "dx " << i;
  }
  for (auto& [name, g] : g2) {
    const Tensor& full = g1.at(name);
    if (g.numel() == full.numel()) {  // replicated: partial per rank, summed over TP
      Tensor sum = g.clone();
      w.all_reduce(sum);
      for (int64_t i = 0; i < g.numel(); i++) EXPECT_NEAR(sum.item(i), full.item(i), 1e-4) << name << " " << i;
    }
  }
}

const std::vector<std::string> kMlaLayoutsTP2{"--tensor-model-parallel-size", "2", "--sequence-parallel",
                                              "--expert-tensor-parallel-size", "1"};

INSTANTIATE_TEST_SUITE_P(
    Layouts, MLALayouts,
    ::testing::Values(
        MLALayout{"TP2_SP", 2, kMlaLayoutsTP2}, MLALayout{"TP2_SP_direct_q", 2, kMlaLayoutsTP2, false},
        MLALayout{"EP2", 2, {"--expert-model-parallel-size", "2"}}, MLALayout{"DP2", 2, {}},
        MLALayout{"TP2xEP2", 4, kMlaLayoutsTP2 + std::vector<std::string>{"--expert-model-parallel-size", "2"}},
        MLALayout{"TP2xDP2_distopt", 4, kMlaLayoutsTP2 + std::vector<std::string>{"--use-distributed-optimizer"}},
        // Context parallelism: the padded q/k/v through the ring, all-gather and all-to-all, YaRN at global positions.
        MLALayout{"CP2", 2, {"--context-parallel-size", "2"}},
        MLALayout{"CP2_a2a", 2, {"--context-parallel-size", "2", "--cp-comm-type", "a2a"}},
        MLALayout{"CP4_allgather", 4, {"--context-parallel-size", "4", "--cp-comm-type", "allgather"}},
        MLALayout{"CP2xTP2", 4, kMlaLayoutsTP2 + std::vector<std::string>{"--context-parallel-size", "2"}}),
    [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace moecore
