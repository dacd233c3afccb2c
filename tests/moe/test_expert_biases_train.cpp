// Training MoE models with linear biases (Megatron's default --add-bias-linear): the flags accept them where Megatron
// does and refuse the rest by name before any work; a GPT with biases everywhere (dense, router, experts) learns the
// copy task; a tiny MoE run with biases resumes from its checkpoint bitwise, its biases trained and restored.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>

#include "config_util.h"
#include "copy_task.h"
#include "moecore/kernels/elementwise.h"
#include "moecore/moe/moe_layer.h"
#include "moecore/train/trainer.h"
#include "test_util.h"

namespace moecore {
namespace {

using testing::operator+;

// tiny_moe_flags with Megatron's default biases.
std::vector<std::string> tiny_biased_moe() {
  std::vector<std::string> f = testing::tiny_moe_flags();
  f.erase(std::find(f.begin(), f.end(), "--disable-bias-linear"));
  return f;
}

std::string config_error(const std::vector<std::string>& extra) {
  return testing::error_of(
      [&] { testing::small_config(tiny_biased_moe() + testing::mock_run_flags(16, 2, 4, 100, 6, "1e-3"), extra); });
}

TEST(ExpertBiasFlags, AcceptedWhereMegatronHasThemRefusedElsewhereByName) {
  EXPECT_EQ(config_error({}), "");
  EXPECT_EQ(config_error({"--expert-tensor-parallel-size", "1"}), "");
  const std::string etp = config_error({"--expert-tensor-parallel-size", "2"});
  EXPECT_TRUE(testing::contains(etp, "--expert-tensor-parallel-size 2 with linear biases")) << etp;
  EXPECT_TRUE(testing::contains(etp, "--disable-bias-linear")) << etp;
  const std::string shared = config_error({"--moe-shared-expert-intermediate-size", "32"});
  EXPECT_TRUE(testing::contains(shared, "--moe-shared-expert-intermediate-size with linear biases")) << shared;
  const std::string up = config_error({"--moe-use-upcycling", "--save", "/nonexistent", "--load", "/nonexistent"});
  EXPECT_TRUE(testing::contains(up, "--moe-use-upcycling with linear biases")) << up;
}

// Dense layers, routers and experts all with biases: the copy task is learnt.
TEST(ExpertBiasTraining, GptWithBiasesLearnsTheCopyTask) {
  nn::GPTConfig g = testing::copy_config();
  g.add_bias_linear = true;
  moe::MoELayerConfig m;
  m.router.hidden = 64;
  m.router.num_experts = 4;
  m.router.topk = 2;
  m.router.load_balancing = {moe::LoadBalancingType::AuxLoss};
  m.router.aux_loss_coeff = {1e-2};
  m.ffn_hidden = 32;
  m.bias = true;
  testing::Trainer t(g, [m](nn::ParamRegistry& reg, const std::string& name, int64_t) {
    return std::make_unique<moe::MoELayer>(reg, name, m);
  });
  t.decay_steps = 400;
  double first = 0, last = 0;
  for (int s = 0; s < 400; s++) {
    last = t.train_step(testing::copy_batch(16, 8, 16, static_cast<uint64_t>(s)));
    if (s == 0) first = last;
    if (s >= 50 && last < 0.02) break;
  }
  EXPECT_GT(first, 2.0);
  EXPECT_LT(last, 0.1);
  const nn::Parameter& b2 = t.reg.get("decoder.layers.1.mlp.experts.linear_fc2.bias");
  EXPECT_GT(kernels::sum_squares(b2.value), 0.0) << "the expert biases train";
}

// Six steps straight against three, a save, and three more after a resume: bitwise the same, the biases included.
TEST(ExpertBiasTraining, TinyMoeResumesBitwise) {
  testing::NullOut null;
  const std::string dir = testing::fresh_temp_path("expert_bias_resume");
  const std::vector<std::string> run = tiny_biased_moe() + testing::mock_run_flags(16, 2, 4, 100, 6, "3e-3") +
                                       std::vector<std::string>{"--moe-aux-loss-coeff", "1e-2"};
  auto config = [&](const std::vector<std::string>& extra) { return testing::small_config(run, extra); };
  train::Trainer straight(config({}), null.f, false);
  std::vector<train::StepResult> want;
  for (int i = 0; i < 6; i++) want.push_back(straight.train_step());
  {
    train::Trainer first(config({"--save", dir}), null.f, false);
    for (int i = 0; i < 3; i++) EXPECT_EQ(first.train_step().lm_loss, want[static_cast<size_t>(i)].lm_loss);
    first.save_checkpoint();
  }
  train::Trainer resumed(config({"--load", dir}), null.f, false);
  ASSERT_EQ(resumed.iteration(), 3);
  for (size_t i = 3; i < 6; i++) {
    const train::StepResult r = resumed.train_step();
    EXPECT_EQ(r.lm_loss, want[i].lm_loss) << "step " << i;
    EXPECT_EQ(r.grad_norm, want[i].grad_norm) << "step " << i;
    EXPECT_EQ(r.aux_losses, want[i].aux_losses) << "step " << i;
  }
  int biases = 0;
  for (const auto& p : straight.params().all()) {
    const bool expert_bias = p->name.find(".experts.linear_fc") != std::string::npos && p->name.size() > 5 &&
                             p->name.compare(p->name.size() - 5, 5, ".bias") == 0;
    if (!expert_bias && p->name.find("router.bias") == std::string::npos) continue;
    biases++;
    if (expert_bias) {
      EXPECT_GT(kernels::sum_squares(p->value), 0.0) << p->name << " trained from zero";
    }
    const Tensor& r = resumed.params().get(p->name).value;
    for (int64_t i = 0; i < r.numel(); i++) ASSERT_EQ(r.item(i), p->value.item(i)) << p->name;
  }
  EXPECT_EQ(biases, 6) << "two MoE layers, each with a router bias and two expert biases";
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace moecore
