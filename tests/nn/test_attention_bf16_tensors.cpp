// Attention under --bf16 on a CPU whose bf16 kernel is FlashNative keeps q, k, v and o in bf16 and lets the kernel
// turn q and k (nn/self_attention.h bf16_tensors): the stash's dtypes for each variant (plain; qk-norm: q and k written
// f32 for the norms, kept rounded, the norms' inputs kept bf16; a bias: the projections' outputs f32, kept rounded; o
// as the output projection's bf16 input), and the output, the input gradient and every weight gradient within bf16
// rounding of the f32 module with the same weights — with RoPE on the whole head and on half of it, and with GQA.
#include <gtest/gtest.h>

#include <string>

#include "moecore/kernels/attention.h"
#include "moecore/nn/self_attention.h"
#include "test_util.h"

namespace moecore {
namespace {

struct Variant {
  bool qk_norm;
  double rot;
  int64_t groups;
  bool bias;
  std::string str() const {
    return "qk_norm=" + std::to_string(qk_norm) + " rot=" + std::to_string(rot) + " groups=" + std::to_string(groups) +
           " bias=" + std::to_string(bias);
  }
};

nn::AttentionConfig variant_config(const Variant& v, bool bf16) {
  nn::AttentionConfig c;
  c.hidden = 64;
  c.num_heads = 4;
  c.num_query_groups = v.groups;
  c.head_dim = 32;
  c.max_seq_len = 128;
  c.rotary_percent = v.rot;
  c.qk_layernorm = v.qk_norm;
  c.bias = v.bias;
  c.init_std = 0.1;
  c.output_init_std = 0.1;
  c.low = bf16 ? LowPrecision(DType::BF16) : std::nullopt;
  return c;
}

TEST(AttentionBf16Tensors, StashDtypesAndTheF32ModulesResults) {
  if (!kernels::attention_bf16_native_io()) GTEST_SKIP() << "this CPU's bf16 attention kernel is not FlashNative";
  for (const Variant& v : {Variant{false, 1.0, 4, false}, Variant{false, 0.5, 2, false}, Variant{true, 1.0, 2, false},
                           Variant{false, 1.0, 1, true}}) {
    nn::ParamRegistry r32(DType::F32), r16(DType::F32);
    nn::Attention a32(r32, "attn", variant_config(v, false)), a16(r16, "attn", variant_config(v, true));
    r32.initialize(3);
    r16.initialize(3);
    const Tensor x = testing::randn({70, 2, 64}, DType::F32, 5), dy = testing::randn(x.shape(), DType::F32, 6);
    nn::Attention::Stash s32, s16;
    const Tensor y32 = a32.forward(x, s32), y16 = a16.forward(x, s16);
    EXPECT_EQ(s16.q_SBND.dtype(), DType::BF16) << v.str();
    EXPECT_EQ(s16.k_SBND.dtype(), DType::BF16) << v.str();
    EXPECT_EQ(s16.v_SBND.dtype(), DType::BF16) << v.str();
    EXPECT_FALSE(s16.o_SBND.defined()) << v.str();
    EXPECT_EQ(s16.proj.x.dtype(), DType::BF16) << v.str();
    EXPECT_EQ(s16.lse_BNS.dtype(), DType::F32) << v.str();
    if (v.qk_norm) EXPECT_EQ(s16.q_norm.x.dtype(), DType::BF16) << v.str();
    if (v.qk_norm) EXPECT_EQ(s16.q_norm.rstd.dtype(), DType::F32) << v.str();
    const Tensor dx32 = a32.backward(dy, s32), dx16 = a16.backward(dy, s16);
    EXPECT_EQ(dx16.dtype(), DType::F32);
    EXPECT_LT(testing::max_rel_diff(y16, y32), 2e-2) << v.str() << " output";
    EXPECT_LT(testing::max_rel_diff(dx16, dx32), 2e-2) << v.str() << " input gradient";
    ASSERT_EQ(r16.all().size(), r32.all().size());
    for (size_t i = 0; i < r32.all().size(); i++)
      EXPECT_LT(testing::max_rel_diff(r16.all()[i]->grad, r32.all()[i]->grad), 2e-2)
          << v.str() << " " << r32.all()[i]->name;
  }
}

}  // namespace
}  // namespace moecore
