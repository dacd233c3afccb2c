// Multi-token prediction (nn/mtp.h): Megatron's roll of ids, labels and mask; parameter names; the fp64
// finite-difference gradient of the whole objective (LM loss + factor/D · Σ_k mtp_k loss) through the MTP depths,
// the shared embedding and output layer; and the flags.
#include <gtest/gtest.h>

#include "config_util.h"
#include "model_util.h"
#include "moecore/kernels/elementwise.h"
#include "moecore/nn/gpt_model.h"
#include "moecore/nn/mtp.h"
#include "moecore/train/config/config.h"
#include "test_util.h"

namespace moecore {
namespace {

using nn::ParamRegistry;
using testing::operator+;

TEST(MTP, RollsLeftAndZeroFillsLikeMegatron) {
  const int64_t S = 4, B = 2;
  Tensor x = Tensor::empty({S * B}, DType::I64);
  for (int64_t t = 0; t < S * B; t++) x.set_item(t, static_cast<double>(t + 1));  // t = s·B + b
  const Tensor y = nn::roll_sequence(x, S, B, 2);
  const double want[] = {5, 6, 7, 8, 0, 0, 0, 0};
  for (int64_t t = 0; t < S * B; t++) EXPECT_EQ(y.item(t), want[t]) << t;
}

nn::GPTConfig mtp_gpt(int64_t depths, bool untied) {
  nn::GPTConfig c = testing::small_gpt({.vocab = 11});
  c.mtp.num_layers = depths;
  c.mtp.loss_scaling_factor = 0.3;
  c.untie_embeddings_and_output_weights = untied;
  return c;
}

TEST(MTP, ParameterNamesLikeMegatron) {
  ParamRegistry reg(DType::F64);
  nn::GPTModel model(mtp_gpt(2, false), reg);
  for (const char* n : {"mtp.layers.0.enorm.weight", "mtp.layers.0.hnorm.weight", "mtp.layers.1.final_layernorm.weight",
                        "mtp.layers.1.mtp_model_layer.self_attention.linear_q.weight",
                        "mtp.layers.0.mtp_model_layer.mlp.linear_fc1.weight"})
    EXPECT_NO_THROW(reg.get(n)) << n;
  const nn::Parameter& eh = reg.get("mtp.layers.0.eh_proj.weight");
  EXPECT_EQ(eh.value.dim(0), 8);
  EXPECT_EQ(eh.value.dim(1), 16);
}

// The labels and mask of depth k are the main ones rolled k; a depth's loss is over its own rolled mask.
TEST(MTP, DepthLabelsAndMasks) {
  ParamRegistry reg(DType::F64);
  nn::GPTModel model(mtp_gpt(2, false), reg);
  reg.initialize(3);
  const int64_t B = 2, S = 5;
  Tensor tokens = testing::randint({B, S}, 11, 1), labels = testing::randint({B, S}, 11, 2);
  auto st = model.make_stash();
  model.forward(tokens, labels, Tensor(), st);
  const Tensor lab = nn::to_sequence_major(labels);
  for (int64_t k = 1; k <= 2; k++) {
    const auto& d = st.mtp.depths[static_cast<size_t>(k - 1)];
    EXPECT_EQ(d.mask_sum, static_cast<double>(B * (S - k)));
    for (int64_t s = 0; s < S; s++)
      for (int64_t b = 0; b < B; b++) {
        EXPECT_EQ(d.labels_T.item(s * B + b), s + k < S ? lab.item((s + k) * B + b) : 0.0);
        EXPECT_EQ(d.mask_T.item(s * B + b), s + k < S ? 1.0 : 0.0);
      }
    EXPECT_GT(d.loss, 0.0);
  }
}

TEST(MTPGrad, WholeObjectiveFiniteDifference) {
  for (bool untied : {false, true}) {
    ParamRegistry reg(DType::F64);
    const nn::GPTConfig cfg = mtp_gpt(2, untied);
    nn::GPTModel model(cfg, reg);
    reg.initialize(7);
    uint64_t seed = 50;
    for (auto& p : reg.all())  // norms away from 1 so their gradients are checked too
      if (p->init.kind != nn::InitKind::Normal)
        p->value.copy_from(testing::randn(p->value.shape(), DType::F64, seed++, 0.5));
    const int64_t B = 2, S = 5;
    Tensor tokens = testing::randint({B, S}, 11, 1), labels = testing::randint({B, S}, 11, 2);
    Tensor mask = Tensor::empty({B, S}, DType::F64);
    kernels::fill_(mask, 1.0);
    mask.set_item(3, 0.0);  // a masked token inside the sequence: its rolled copies vanish too
    auto st = model.make_stash();
    auto loss = [&] {
      double J = model.forward(tokens, labels, mask, st), m = 0;
      for (const auto& d : st.mtp.depths) m += d.loss;
      return J + cfg.mtp.loss_scaling_factor / static_cast<double>(cfg.mtp.num_layers) * m;
    };
    reg.zero_grad();
    loss();
    model.backward(st);
    // Depth 2's attention sits behind the decoder and depth 1 (the longest product chains of any model test): the
    // finite-difference truncation reaches 3e-6 there, so 4 x kGradTol (the whole-model tests use 2 x).
    for (auto& p : reg.all())
      EXPECT_LT(testing::fd_rel_error(loss, p->value, p->grad, 40), 4 * testing::kGradTol)
          << "untied=" << untied << " " << p->name;
    // The MTP depths train: their parameters get gradients.
    EXPECT_GT(kernels::sum_squares(reg.get("mtp.layers.1.eh_proj.weight").grad), 0.0);
  }
}

const std::vector<std::string> kMtpRun =
    testing::rmsnorm_rope_flags() +
    std::vector<std::string>{"--mock-data", "--vocab-size", "64", "--train-iters", "10"};

TEST(MTPFlags, DefaultsRangeAndRefusals) {
  const train::TrainConfig c = testing::small_config(kMtpRun);
  EXPECT_EQ(c.mtp_num_layers, 0);
  EXPECT_EQ(c.mtp_loss_scaling_factor, 0.1);
  const nn::GPTConfig g = train::gpt_config(
      testing::small_config(kMtpRun, {"--mtp-num-layers", "2", "--mtp-loss-scaling-factor", "0.2"}), 64);
  EXPECT_EQ(g.mtp.num_layers, 2);
  EXPECT_EQ(g.mtp.loss_scaling_factor, 0.2);
  std::string e = testing::user_error_of([&] { testing::small_config(kMtpRun, {"--mtp-num-layers", "-1"}); });
  EXPECT_NE(e.find("--mtp-num-layers"), std::string::npos) << e;
  e = testing::user_error_of([&] {
    testing::small_config(kMtpRun, {"--mtp-num-layers", "1", "--position-embedding-type", "learned_absolute"});
  });
  EXPECT_NE(e.find("rope or none"), std::string::npos) << e;
  e = testing::user_error_of(
      [&] { testing::small_config(kMtpRun + std::vector<std::string>{"--mtp-use-repeated-layer"}); });
  EXPECT_NE(e.find("--mtp-use-repeated-layer"), std::string::npos) << e;
}

}  // namespace
}  // namespace moecore
