// Multi-Latent Attention: fp64 finite-difference gradient checks of the module (input and every parameter) with and
// without the q latent, with and without the latent norms, YaRN and plain RoPE, v_head_dim below and above the qk
// width; and the kernel's RoPE variants (interleaved pairs at an offset, YaRN tables with their amplitude).
#include <gtest/gtest.h>

#include "module_grad_util.h"
#include "moecore/kernels/elementwise.h"
#include "moecore/kernels/rope.h"
#include "moecore/nn/mla_attention.h"
#include "test_util.h"

namespace moecore {
namespace {

using nn::ParamRegistry;
using testing::fd_rel_error;
using testing::kGradTol;
using testing::randn;

struct MLACase {
  int64_t q_lora;
  bool norms, yarn;
  int64_t v_dim;
  double rotary_percent = 1.0;
};

TEST(MLAGrad, Variants) {
  for (MLACase c : {MLACase{6, true, true, 4}, MLACase{0, true, false, 4}, MLACase{6, false, false, 8, 0.5},
                    MLACase{0, false, true, 7}}) {
    ParamRegistry reg(DType::F64);
    nn::AttentionConfig a;
    a.hidden = 8, a.num_heads = 3, a.max_seq_len = 16, a.init_std = 0.4, a.output_init_std = 0.3;
    a.norm_eps = 1e-6, a.qk_layernorm = c.norms, a.rotary_percent = c.rotary_percent;
    nn::MLAConfig m;
    m.enabled = true, m.q_lora_rank = c.q_lora, m.kv_lora_rank = 5, m.qk_head_dim = 3, m.qk_pos_emb_head_dim = 4;
    m.v_head_dim = c.v_dim, m.yarn = c.yarn;
    // A YaRN whose correction range falls inside the 2 frequencies, with both mscales, so every term is exercised.
    m.yarn_params.scaling_factor = 4, m.yarn_params.original_max_position_embeddings = 8;
    m.yarn_params.mscale = 0.7, m.yarn_params.mscale_all_dim = 0.5;
    nn::MLAttention mla(reg, "attn", a, m);
    reg.initialize(3);
    uint64_t s = 50;
    for (auto& p : reg.all())
      if (p->init.kind != nn::InitKind::Normal) p->value.copy_from(randn(p->value.shape(), DType::F64, s++, 0.5));
    Tensor x = randn({5, 2, 8}, DType::F64, 2);
    nn::MLAttention::Stash st;
    testing::check_module(
        reg, x, [&] { return mla.forward(x, st); }, [&](const Tensor& dy) { return mla.backward(dy, st); },
        fmt::format("mla q_lora={} norms={} yarn={} v={}", c.q_lora, c.norms, c.yarn, c.v_dim));
  }
}

TEST(MLAGrad, ParameterNamesAndShapes) {
  ParamRegistry reg(DType::F64);
  nn::AttentionConfig a;
  a.hidden = 8, a.num_heads = 2, a.max_seq_len = 4, a.qk_layernorm = true;
  nn::MLAConfig m{.enabled = true,
                  .q_lora_rank = 6,
                  .kv_lora_rank = 5,
                  .qk_head_dim = 3,
                  .qk_pos_emb_head_dim = 4,
                  .v_head_dim = 2,
                  .yarn = true,
                  .yarn_params = {}};
  nn::MLAttention mla(reg, "l.self_attention", a, m);
  std::vector<std::string> got;
  for (auto& p : reg.all()) got.push_back(p->name + p->value.shape().str());
  const std::vector<std::string> want = {"l.self_attention.linear_kv_down_proj.weight[9, 8]",
                                         "l.self_attention.linear_kv_up_proj.weight[10, 5]",
                                         "l.self_attention.linear_proj.weight[8, 4]",
                                         "l.self_attention.linear_q_down_proj.weight[6, 8]",
                                         "l.self_attention.linear_q_up_proj.weight[14, 6]",
                                         "l.self_attention.q_layernorm.weight[6]",
                                         "l.self_attention.kv_layernorm.weight[5]"};
  EXPECT_EQ(got, want);
}

// Interleaved pairs at an offset: the map is m·R (norm of each pair scaled by m) and backward is its transpose.
TEST(RopeKernel, InterleavedAtOffsetGradAndNorm) {
  const int64_t S = 4, rot = 4, D = 7, off = 2;
  Tensor c, s;
  kernels::YarnParams y;
  y.scaling_factor = 3, y.original_max_position_embeddings = 6, y.mscale = 0.5;
  kernels::rope_tables_from(S, kernels::yarn_inv_freq(rot, 100.0, y), kernels::yarn_concentration_factor(y), DType::F64,
                            c, s);
  Tensor x = randn({S, 2, 3, D}, DType::F64, 1), W = randn({S, 2, 3, D}, DType::F64, 2);
  auto loss = [&] {
    Tensor out = Tensor::empty(x.shape(), DType::F64);
    kernels::rope_forward_at(x, c, s, off, rot, kernels::RopePairs::Interleaved, out);
    return kernels::dot(out, W);
  };
  Tensor dx = Tensor::empty(x.shape(), DType::F64);
  kernels::rope_backward_at(W, c, s, off, rot, kernels::RopePairs::Interleaved, dx);
  EXPECT_LT(fd_rel_error(loss, x, dx), kGradTol);
  Tensor out = Tensor::empty(x.shape(), DType::F64);
  kernels::rope_forward_at(x, c, s, off, rot, kernels::RopePairs::Interleaved, out);
  const double m = kernels::yarn_concentration_factor(y);
  for (int64_t r = 0; r < S * 6; r++) {
    for (int64_t i = 0; i < D; i++)
      if (i < off || i >= off + rot) {
        EXPECT_EQ(out.item(r * D + i), x.item(r * D + i));
      }
    for (int64_t p = 0; p < rot / 2; p++) {
      const int64_t a = r * D + off + 2 * p;
      const double nx = std::hypot(x.item(a), x.item(a + 1)), ny = std::hypot(out.item(a), out.item(a + 1));
      EXPECT_NEAR(ny, m * nx, 1e-12);
    }
  }
}

}  // namespace
}  // namespace moecore
