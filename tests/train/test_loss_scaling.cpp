// Loss scaling through training (optim/grad_scaler.h, the trainer's skipped steps): under --fp16 Megatron's dynamic
// scaler from planted overflows (a large --initial-loss-scale and a z-loss whose gradients exceed 2: scaled, they
// overflow the f16 activation gradients) skip steps without touching parameters, Adam state or the learning-rate
// schedule, backs off, then trains; the log line and the metrics file count the skipped iterations; a resumed --fp16
// run continues bitwise (the scaler's trackers and the skipped count in the checkpoint, the f16 weights rounded from
// the restored f32 masters); a constant power-of-two --loss-scale under --bf16 changes no bit of training.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "config_util.h"
#include "moecore/core/file.h"
#include "moecore/kernels/elementwise.h"
#include "moecore/train/config/optimizer_config.h"
#include "moecore/train/trainer.h"
#include "test_util.h"

namespace moecore {
namespace {

using testing::operator+;

std::vector<std::string> scaled_flags(int64_t iters) {
  return testing::tiny_moe_flags() + testing::mock_run_flags(16, 2, 4, 100, iters, "3e-3") +
         std::vector<std::string>{"--moe-aux-loss-coeff", "1e-2", "--moe-z-loss-coeff", "10"};
}

// 2^127 (which overflows f32) would take over a hundred skipped steps to back off from under fp16, whose activation
// gradients overflow from 65,520: 2^18 overflows the first steps and backs off into range within a few.
constexpr const char* kInitialScale = "262144";  // 2^18
constexpr float kInitialScaleValue = 0x1p18f;

std::vector<std::string> dynamic_flags() {
  return {"--fp16",
          "--accumulate-allreduce-grads-in-fp32",
          "--initial-loss-scale",
          kInitialScale,
          "--hysteresis",
          "2",
          "--loss-scale-window",
          "30"};
}

std::map<std::string, Tensor> snapshot(train::Trainer& t) {
  std::map<std::string, Tensor> m;
  for (const auto& p : t.params().all()) m[p->name] = p->value.clone();
  return m;
}

bool same(const std::map<std::string, Tensor>& a, const std::map<std::string, Tensor>& b) {
  for (const auto& [n, t] : a)
    if (!testing::bitwise_equal(t, b.at(n))) return false;
  return true;
}

TEST(LossScaling, PlantedOverflowsSkipStepsThenTrain) {
  testing::NullOut null;
  train::Trainer t(testing::small_config(scaled_flags(12), dynamic_flags()), null.f, false);
  // Megatron's rule, by hand, on the overflows as they come (hysteresis 2, window 30).
  float scale = kInitialScaleValue;
  int64_t skipped = 0, applied = 0, hyst = 2, growth = 0;
  for (int i = 0; i < 12; i++) {
    const auto before = snapshot(t);
    const train::StepResult r = t.train_step();
    EXPECT_EQ(r.skipped, !std::isfinite(r.grad_norm)) << "step " << i;
    if (r.skipped) {
      skipped++;
      EXPECT_TRUE(same(before, snapshot(t))) << "a skipped step changed a parameter, step " << i;
      growth = 0;
      if (--hyst <= 0) scale /= 2;
    } else {
      applied++;
      EXPECT_FALSE(same(before, snapshot(t))) << "an applied step changed nothing, step " << i;
      if (++growth == 30) {
        growth = 0;
        hyst = 2;
        scale *= 2;
      }
    }
    EXPECT_EQ(r.loss_scale, static_cast<double>(scale)) << "step " << i;
  }
  EXPECT_GE(skipped, 2) << kInitialScale << " should overflow some steps under fp16 (the z-loss's gradients exceed 2)";
  EXPECT_GE(applied, 3) << "the backed-off scale should train";
}

TEST(LossScaling, LogLineAndMetricsCountSkippedIterations) {
  const std::string out_path = testing::fresh_temp_path("loss_scaling_out"), metrics = out_path + ".jsonl";
  const train::TrainConfig c = testing::small_config(
      scaled_flags(6), dynamic_flags() + std::vector<std::string>{"--log-interval", "3", "--metrics-file", metrics});
  {
    std::FILE* out = std::fopen(out_path.c_str(), "w");
    train::Trainer t(c, out, false);
    t.run();
    std::fclose(out);
  }
  const std::string console = read_file(out_path, "the training log");
  EXPECT_TRUE(testing::contains(console, " loss scale: ")) << console;
  EXPECT_TRUE(testing::contains(console, " number of nan iterations: ")) << console;
  int64_t logged = 0;  // the log lines' skipped counts, one per interval
  for (size_t at = console.find("number of skipped iterations:"); at != std::string::npos;
       at = console.find("number of skipped iterations:", at + 1))
    logged += std::stoll(console.substr(at + 29, 4));
  std::ifstream in(metrics);
  int64_t total = 0;
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j.contains("skipped_iterations")) total += j["skipped_iterations"].get<int64_t>();
  }
  EXPECT_GE(total, 2) << console;
  EXPECT_EQ(logged, total) << console;
}

TEST(LossScaling, ResumeContinuesBitwise) {
  testing::NullOut null;
  const std::string dir = testing::fresh_temp_path("loss_scaling_resume");
  const auto flags = scaled_flags(8);
  train::Trainer straight(testing::small_config(flags, dynamic_flags()), null.f, false);
  std::vector<train::StepResult> want;
  for (int i = 0; i < 8; i++) want.push_back(straight.train_step());
  {
    train::Trainer first(testing::small_config(flags, dynamic_flags() + std::vector<std::string>{"--save", dir}),
                         null.f, false);
    for (int i = 0; i < 3; i++) first.train_step();  // mid-hysteresis: the trackers matter
    first.save_checkpoint();
  }
  train::Trainer resumed(
      testing::small_config(flags, dynamic_flags() + std::vector<std::string>{"--save", dir, "--load", dir}), null.f,
      false);
  for (int i = 3; i < 8; i++) {
    const train::StepResult r = resumed.train_step();
    const train::StepResult& w = want[static_cast<size_t>(i)];
    EXPECT_EQ(r.skipped, w.skipped) << "step " << i;
    EXPECT_EQ(r.loss_scale, w.loss_scale) << "step " << i;
    EXPECT_EQ(r.lm_loss, w.lm_loss) << "step " << i;
    if (!w.skipped) EXPECT_EQ(r.grad_norm, w.grad_norm) << "step " << i;
  }
  EXPECT_TRUE(same(snapshot(straight), snapshot(resumed)));
}

TEST(LossScaling, PowerOfTwoConstantScaleUnderBf16ChangesNoBit) {
  testing::NullOut null;
  const auto flags = scaled_flags(4) + std::vector<std::string>{"--bf16"};
  train::Trainer plain(testing::small_config(flags), null.f, false);
  train::Trainer scaled(testing::small_config(flags, {"--loss-scale", "4096"}), null.f, false);
  for (int i = 0; i < 4; i++) {
    const train::StepResult a = plain.train_step(), b = scaled.train_step();
    EXPECT_EQ(a.lm_loss, b.lm_loss) << "step " << i;
    EXPECT_EQ(a.grad_norm, b.grad_norm) << "step " << i;
    EXPECT_EQ(b.loss_scale, 4096.0);
    EXPECT_FALSE(b.skipped);
  }
  EXPECT_TRUE(same(snapshot(plain), snapshot(scaled)));
}

TEST(LossScaling, FlagsAsMegatron) {
  const auto base = scaled_flags(2);
  EXPECT_TRUE(testing::contains(testing::user_error_of([&] {
                                  testing::small_config(base, {"--fp16", "--bf16"});
                                }),
                                "exclusive"));
  // fp16 without --accumulate-allreduce-grads-in-fp32 trains with fp16 main gradients (optim/low_precision_grads.h).
  EXPECT_EQ(train::grad_precision(testing::small_config(base, {"--fp16"})).main, DType::F16);
  // fp16 with fp32 main gradients trains; the dynamic scaler is its default and then checks no NaN itself.
  const train::TrainConfig fp16 = testing::small_config(base, {"--fp16", "--accumulate-allreduce-grads-in-fp32"});
  EXPECT_EQ(train::grad_scaler_config(fp16).kind, optim::GradScalerConfig::Kind::Dynamic);
  EXPECT_FALSE(train::check_nan_in_loss_and_grad(fp16));
  const train::TrainConfig constant =
      testing::small_config(base, {"--fp16", "--accumulate-allreduce-grads-in-fp32", "--loss-scale", "128"});
  EXPECT_EQ(train::grad_scaler_config(constant).kind, optim::GradScalerConfig::Kind::Constant);
  EXPECT_TRUE(train::check_nan_in_loss_and_grad(constant));
  EXPECT_TRUE(testing::contains(testing::user_error_of([&] {
                                  testing::small_config(base, {"--fp16", "--accumulate-allreduce-grads-in-fp32",
                                                               "--min-loss-scale", "8", "--initial-loss-scale", "4"});
                                }),
                                "--min-loss-scale"));
  EXPECT_TRUE(testing::contains(
      testing::user_error_of([&] {
        testing::small_config(base, {"--fp16", "--accumulate-allreduce-grads-in-fp32", "--fp8-format", "e4m3"});
      }),
      "--fp8-format"));
  EXPECT_TRUE(testing::contains(testing::user_error_of([&] {
                                  testing::small_config(base, {"--hysteresis", "0"});
                                }),
                                "--hysteresis"));
  EXPECT_TRUE(testing::contains(
      testing::user_error_of([&] { testing::small_config(base, {"--fp16-lm-cross-entropy"}); }), "computed in fp16"));
}

}  // namespace
}  // namespace moecore
