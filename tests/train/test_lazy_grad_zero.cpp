// Lazily zeroed gradients (Parameter::grad_stale): a training step marks last step's gradients stale instead of
// zeroing them; the first weight-gradient GEMM of the step overwrites them (beta 0), element-wise writers zero them
// first, and what no backward wrote is zeroed before anything reads it. With the stale gradients filled with NaN
// (ParamRegistry::set_lazy_zero) every step must give the bits of gradients zeroed every step: a writer that added
// into a stale gradient, or a reader that read one, would make them NaN, and one that skipped it would lose its sum.
// The models cover every kind of gradient writer: linear layers with and without biases, LayerNorm and RMSNorm (qk-norm
// too), learned positions, tied and untied embeddings, the router (and its expert bias), gated shared experts, MLA,
// MTP, experts that receive no tokens, and one and two micro-batches, in f32 and bf16.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "config_util.h"
#include "moecore/nn/parameter.h"
#include "moecore/train/trainer.h"

namespace moecore {
namespace {

using testing::operator+;

using LazyZero = nn::ParamRegistry::LazyZero;
struct Mode {
  explicit Mode(LazyZero m) { nn::ParamRegistry::set_lazy_zero(m); }
  ~Mode() { nn::ParamRegistry::set_lazy_zero(LazyZero::Lazy); }
};

std::vector<std::pair<double, double>> steps(const std::vector<std::string>& flags, LazyZero mode) {
  const Mode m(mode);
  std::FILE* null = std::fopen("/dev/null", "w");
  train::Trainer t(testing::small_config(flags), null, false);
  std::vector<std::pair<double, double>> out;
  for (int i = 0; i < 3; i++) {
    const train::StepResult r = t.train_step();
    out.emplace_back(r.lm_loss, r.grad_norm);
  }
  std::fclose(null);
  return out;
}

// Poisoned stale gradients against gradients zeroed every step: a lost contribution (a writer that wrote a stale
// gradient without taking it) and a stale read both show.
void expect_same_bits_poisoned(const std::vector<std::string>& flags) {
  const auto eager = steps(flags, LazyZero::Eager), poisoned = steps(flags, LazyZero::Poisoned);
  for (size_t i = 0; i < eager.size(); i++) {
    EXPECT_TRUE(std::isfinite(poisoned[i].first) && std::isfinite(poisoned[i].second)) << "step " << i;
    EXPECT_EQ(eager[i].first, poisoned[i].first) << "loss, step " << i;
    EXPECT_EQ(eager[i].second, poisoned[i].second) << "grad norm, step " << i;
  }
}

TEST(LazyGradZero, LayeredMoeF32AndBf16TwoMicroBatches) {
  const auto f = testing::layered_moe_flags() + testing::mock_run_flags(16, 2, 4, 128, 3, "1e-3");
  expect_same_bits_poisoned(f);
  expect_same_bits_poisoned(f + std::vector<std::string>{"--bf16"});
}

// Megatron's defaults on a dense model: LayerNorm with biases, learned absolute positions, tied embeddings, linear
// biases.
TEST(LazyGradZero, LayerNormBiasesLearnedPositionsTiedEmbeddings) {
  const std::vector<std::string> f = {"--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4"};
  expect_same_bits_poisoned(f + testing::mock_run_flags(8, 1, 2, 64, 3, "1e-3"));
}

// 16 experts, top-1, 8 tokens per micro-batch: most experts receive none, and their gradient slices are zeroed.
TEST(LazyGradZero, ExpertsWithoutTokens) {
  const auto f = train::override_flags(testing::tiny_moe_flags() + testing::mock_run_flags(8, 1, 1, 64, 3, "1e-3"),
                                       {"--num-experts", "16", "--moe-router-topk", "1", "--moe-router-pre-softmax"});
  expect_same_bits_poisoned(f);
}

TEST(LazyGradZero, MlaMtpAndExpertBias) {
  const auto f = testing::tiny_moe_flags() + testing::small_mla_flags(true) + testing::deepseek_routing_flags() +
                 std::vector<std::string>{"--mtp-num-layers", "1"} + testing::mock_run_flags(16, 2, 2, 128, 3, "1e-3");
  expect_same_bits_poisoned(f);
}

}  // namespace
}  // namespace moecore
