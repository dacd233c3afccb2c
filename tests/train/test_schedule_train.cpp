// The scheduler and the loss normalisation in training: --train-samples ends at the derived iteration; each step
// runs at the scheduler's learning rate and weight decay; a resume continues the schedule bitwise, refuses other
// schedule flags, and --use-checkpoint-opt_param-scheduler / --override-opt_param-scheduler take the checkpoint's or
// the flags' (Megatron's semantics); --eod-mask-loss masks end-of-document tokens; the reported loss is over the
// loss tokens of the whole global batch; --calculate-per-token-loss gives the gradient of the whole batch's
// per-token mean and keeps the aux-loss gradients Megatron's.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>

#include "config_util.h"
#include "moecore/data/gpt_dataset.h"
#include "moecore/train/trainer.h"
#include "test_util.h"

namespace moecore {
namespace {

using testing::operator+;
using testing::error_of;

std::vector<std::string> run_flags() {
  return testing::tiny_moe_flags() +
         std::vector<std::string>{"--moe-aux-loss-coeff", "1e-2", "--moe-z-loss-coeff", "1e-3",
                                  "--lr-warmup-iters",    "2",    "--lr-decay-style",   "cosine",
                                  "--lr-warmup-init",     "1e-4"} +
         testing::mock_run_flags(16, 2, 4, 100, 6, "3e-3");
}
train::TrainConfig schedule_config(const std::vector<std::string>& extra) {
  return testing::small_config(run_flags(), extra);
}

TEST(ScheduleTraining, TrainSamplesEndsAtTheDerivedIteration) {
  testing::NullOut null;
  // 26 samples in global batches of 4: Megatron trains 26 // 4 = 6 iterations.
  auto c = testing::small_config(
      train::override_flags(run_flags(), {"--log-interval", "100"}),
      {"--train-samples", "26", "--train-iters", "0", "--lr-warmup-iters", "0", "--lr-warmup-samples", "8"});
  EXPECT_EQ(c.train_iters, 6);
  train::Trainer t(c, null.f, false);
  t.run();
  EXPECT_EQ(t.iteration(), 6);
}

TEST(ScheduleTraining, StepsRunAtTheSchedulersRate) {
  testing::NullOut null;
  const auto c = schedule_config({});
  const auto s = train::lr_schedule(c);
  train::Trainer t(c, null.f, false);
  for (int64_t k = 0; k < 4; k++) EXPECT_EQ(t.train_step().lr, s.lr(4 * k)) << "iteration " << k;
  EXPECT_DOUBLE_EQ(s.lr(0), 1e-4);  // the warmup starts at --lr-warmup-init
}

TEST(ScheduleTraining, WeightDecayFollowsTheSchedule) {
  testing::NullOut null;
  auto losses = [&](const std::vector<std::string>& extra) {
    train::Trainer t(schedule_config(extra), null.f, false);
    std::vector<double> l;
    for (int i = 0; i < 3; i++) l.push_back(t.train_step().lm_loss);
    return l;
  };
  const auto constant = losses({"--weight-decay", "0.5"});
  // A linear increase from 0.5 to 0.5 is the constant 0.5, bitwise.
  EXPECT_EQ(losses({"--weight-decay-incr-style", "linear", "--start-weight-decay", "0.5", "--end-weight-decay", "0.5"}),
            constant);
  // From 0 to 5: the first update has no decay (wd(0) = 0), later ones more than 0.5.
  const auto none = losses({"--weight-decay", "0"});
  const auto rising =
      losses({"--weight-decay-incr-style", "linear", "--start-weight-decay", "0", "--end-weight-decay", "5"});
  EXPECT_EQ(rising[1], none[1]);
  EXPECT_NE(rising[2], none[2]);
}

TEST(ScheduleTraining, ResumeTakesTheSchedulerAsMegatronDoes) {
  testing::NullOut null;
  const std::string dir = testing::fresh_temp_path("schedule_resume");
  std::vector<train::StepResult> want;
  {
    train::Trainer straight(schedule_config({}), null.f, false);
    for (int i = 0; i < 6; i++) want.push_back(straight.train_step());
  }
  {
    train::Trainer first(schedule_config({"--save", dir}), null.f, false);
    for (int i = 0; i < 3; i++) first.train_step();
    first.save_checkpoint();
  }
  {  // The same flags: the schedule and the losses continue bitwise.
    train::Trainer resumed(schedule_config({"--load", dir}), null.f, false);
    for (int i = 3; i < 6; i++) {
      const auto r = resumed.train_step();
      EXPECT_EQ(r.lr, want[static_cast<size_t>(i)].lr) << i;
      EXPECT_EQ(r.lm_loss, want[static_cast<size_t>(i)].lm_loss) << i;
      EXPECT_EQ(r.grad_norm, want[static_cast<size_t>(i)].grad_norm) << i;
    }
  }
  // Another schedule is refused, naming the values (in samples where Megatron counts samples).
  std::string e = error_of([&] { train::Trainer(schedule_config({"--load", dir, "--lr", "1e-3"}), null.f, false); });
  EXPECT_NE(e.find("different learning-rate schedule"), std::string::npos) << e;
  EXPECT_NE(e.find("--lr: 0.003 in the checkpoint, 0.001 here"), std::string::npos) << e;
  e = error_of([&] { train::Trainer(schedule_config({"--load", dir, "--lr-warmup-iters", "1"}), null.f, false); });
  EXPECT_NE(e.find("warmup samples (--lr-warmup-iters x batch, -samples or -fraction): 8 in the checkpoint, 4 here"),
            std::string::npos)
      << e;
  // The same schedule in samples is the same schedule.
  EXPECT_EQ(train::Trainer(schedule_config({"--load", dir, "--train-iters", "0", "--train-samples", "24",
                                            "--lr-warmup-iters", "0", "--lr-warmup-samples", "8"}),
                           null.f, false)
                .train_step()
                .lr,
            want[3].lr);
  {  // --use-checkpoint-opt_param-scheduler: the checkpoint's schedule, whatever the flags say.
    train::Trainer t(schedule_config({"--load", dir, "--lr", "1e-3", "--use-checkpoint-opt_param-scheduler"}), null.f,
                     false);
    for (int i = 3; i < 6; i++) {
      const auto r = t.train_step();
      EXPECT_EQ(r.lr, want[static_cast<size_t>(i)].lr) << i;
      EXPECT_EQ(r.lm_loss, want[static_cast<size_t>(i)].lm_loss) << i;
    }
  }
  {  // --override-opt_param-scheduler: the flags' schedule from the checkpoint's step count.
    const auto c = schedule_config({"--load", dir, "--lr", "1e-3", "--override-opt_param-scheduler"});
    train::Trainer t(c, null.f, false);
    EXPECT_EQ(t.train_step().lr, train::lr_schedule(c).lr(12));
    EXPECT_NE(want[3].lr, train::lr_schedule(c).lr(12));
  }
  {  // --no-load-optim: Megatron loads the scheduler with the optimizer, so it starts afresh.
    train::Trainer t(schedule_config({"--load", dir, "--no-load-optim", "--lr", "1e-3"}), null.f, false);
    EXPECT_EQ(t.iteration(), 3);
    EXPECT_EQ(t.train_step().lr, 1e-4);
  }
  // A longer run keeps a constant weight decay (accepted, unlike Megatron, which compares the weight-decay length
  // too); another weight-decay style is refused.
  EXPECT_EQ(
      train::Trainer(schedule_config({"--load", dir, "--train-iters", "8", "--lr-decay-iters", "6"}), null.f, false)
          .train_step()
          .lr,
      want[3].lr);
  e = error_of([&] {
    train::Trainer(schedule_config({"--load", dir, "--weight-decay-incr-style", "linear", "--start-weight-decay",
                                    "0.01", "--end-weight-decay", "0.01"}),
                   null.f, false);
  });
  EXPECT_NE(e.find("--weight-decay-incr-style: constant in the checkpoint, linear here"), std::string::npos) << e;
  std::filesystem::remove_all(dir);
}

// make_batch masks the loss at end-of-document input tokens under --eod-mask-loss.
TEST(EodMaskLoss, MasksEndOfDocumentTokens) {
  data::MockGPTDataset ds(4, 16, 4, 9);  // tokens 0..3
  const auto b = data::make_batch(ds, {0, 1, 2, 3}, 3);
  int64_t eod = 0;
  for (int64_t i = 0; i < b.tokens.numel(); i++) {
    const bool is_eod = b.tokens.item(i) == 3;
    eod += is_eod;
    EXPECT_EQ(b.loss_mask.item(i), is_eod ? 0.0 : 1.0) << i;
  }
  EXPECT_GT(eod, 0);
  const auto all = data::make_batch(ds, {0, 1, 2, 3});
  for (int64_t i = 0; i < all.loss_mask.numel(); i++) EXPECT_EQ(all.loss_mask.item(i), 1.0);
}

// A dense model on 8 mock tokens plus NullTokenizer's EOD (one token in 9 carries no loss), 4 micro-batches of 1.
std::vector<std::string> masked_flags(bool moe) {
  std::vector<std::string> f = {"--num-layers",
                                "2",
                                "--hidden-size",
                                "32",
                                "--num-attention-heads",
                                "4",
                                "--swiglu",
                                "--disable-bias-linear",
                                "--tokenizer-type",
                                "NullTokenizer",
                                "--log-interval",
                                "100"};
  if (moe)
    f = f + std::vector<std::string>{"--num-experts",         "4",   "--moe-router-topk",    "2",
                                     "--moe-ffn-hidden-size", "32",  "--moe-aux-loss-coeff", "1e-1",
                                     "--moe-z-loss-coeff",    "1e-2"};
  return f + testing::mock_run_flags(16, 1, 4, 8, 2, "1e-3");
}

std::vector<double> gradients(train::Trainer& t) {
  std::vector<double> g;
  for (const auto& p : t.params().all())
    for (int64_t i = 0; i < p->grad.numel(); i++) g.push_back(p->grad.item(i));
  return g;
}

TEST(PerTokenLoss, ReportsTheLossOverTheGlobalBatchsTokens) {
  testing::NullOut null;
  const auto c = testing::small_config(masked_flags(false), {"--eod-mask-loss"});
  train::Trainer t(c, null.f, false), probe(c, null.f, false);
  // By hand: each micro-batch's mean loss and loss tokens from the same model and samples.
  data::MockGPTDataset ds(8, 16, 9, static_cast<uint64_t>(c.seed));
  double sum = 0, tokens = 0, mean_of_means = 0;
  std::vector<double> counts;
  for (int64_t m = 0; m < 4; m++) {
    const auto b = data::make_batch(ds, {m}, 8);
    nn::GPTModel::Stash st = probe.model().make_stash();
    const double l = probe.model().forward(b.tokens, b.labels, b.loss_mask, st);
    sum += l * st.mask_sum;
    tokens += st.mask_sum;
    counts.push_back(st.mask_sum);
    mean_of_means += l / 4;
  }
  EXPECT_TRUE(counts[0] != counts[1] || counts[1] != counts[2] || counts[2] != counts[3]);  // the example has teeth
  EXPECT_LT(tokens, 64);
  const double reported = t.train_step().lm_loss;
  EXPECT_NEAR(reported, sum / tokens, 1e-6 * reported);
  EXPECT_GT(std::fabs(reported - mean_of_means), 1e-5);
}

TEST(PerTokenLoss, GradientIsTheGlobalBatchsPerTokenMean) {
  testing::NullOut null;
  // Per-token loss over 4 micro-batches = one micro-batch of 4 sequences (its mean is over all the batch's tokens).
  train::Trainer per_token(
      testing::small_config(masked_flags(false), {"--eod-mask-loss", "--calculate-per-token-loss"}), null.f, false);
  train::Trainer whole(testing::small_config(masked_flags(false), {"--eod-mask-loss", "--micro-batch-size", "4"}),
                       null.f, false);
  train::Trainer per_micro(testing::small_config(masked_flags(false), {"--eod-mask-loss"}), null.f, false);
  const auto a = per_token.train_step(), b = whole.train_step(), d = per_micro.train_step();
  EXPECT_NEAR(a.lm_loss, b.lm_loss, 1e-6 * b.lm_loss);
  EXPECT_NEAR(a.grad_norm, b.grad_norm, 1e-5 * b.grad_norm);
  EXPECT_GT(std::fabs(d.grad_norm - b.grad_norm), 1e-4 * b.grad_norm);  // the mean of micro-batch means differs
  const auto ga = gradients(per_token), gb = gradients(whole);
  ASSERT_EQ(ga.size(), gb.size());
  double diff = 0, norm = 0;
  for (size_t i = 0; i < ga.size(); i++) {
    diff += (ga[i] - gb[i]) * (ga[i] - gb[i]);
    norm += gb[i] * gb[i];
  }
  EXPECT_LT(std::sqrt(diff), 1e-5 * std::sqrt(norm));
}

TEST(PerTokenLoss, AuxLossGradientsKeepMegatronsScale) {
  testing::NullOut null;
  // Every token has a loss: per-token and per-micro-batch normalisation give the same gradients, the aux and z
  // losses' included (Megatron multiplies them by the micro-batch's tokens so their scale stays 1/micro-batches).
  train::Trainer per_token(testing::small_config(masked_flags(true), {"--calculate-per-token-loss"}), null.f, false);
  train::Trainer mean(testing::small_config(masked_flags(true)), null.f, false);
  for (int step = 0; step < 2; step++) {
    const auto a = per_token.train_step(), b = mean.train_step();
    EXPECT_NEAR(a.lm_loss, b.lm_loss, 1e-6 * b.lm_loss) << step;
    EXPECT_NEAR(a.grad_norm, b.grad_norm, 1e-6 * b.grad_norm) << step;
    ASSERT_EQ(a.aux_losses.size(), b.aux_losses.size());
    for (size_t i = 0; i < a.aux_losses.size(); i++) EXPECT_NEAR(a.aux_losses[i], b.aux_losses[i], 1e-6) << step;
  }
  // With masked tokens the aux gradients are scaled by the micro-batch's tokens over the global loss tokens.
  train::Trainer masked(testing::small_config(masked_flags(true), {"--calculate-per-token-loss", "--eod-mask-loss"}),
                        null.f, false);
  EXPECT_TRUE(std::isfinite(masked.train_step().grad_norm));
}

}  // namespace
}  // namespace moecore
