// --fp16 training (with --accumulate-allreduce-grads-in-fp32): f16 GEMM operands and weights with f32 masters and
// accumulation, Megatron's dynamic loss scaler. Losses track bf16's within 1% over 20 steps of a small MoE model, the
// first step's loss is fp32's within f16's rounding, the GEMM weights are held in f16 beside their f32 masters, every
// GEMM multiplies widened f32 operands, and a rerun is bitwise. (Resume under --fp16 is
// LossScaling.ResumeContinuesBitwise.)
#include <gtest/gtest.h>

#include <cmath>

#include "config_util.h"
#include "moecore/kernels/gemm.h"
#include "moecore/train/trainer.h"
#include "test_util.h"

namespace moecore {
namespace {

using testing::operator+;

const std::vector<std::string> kFp16 = {"--fp16", "--accumulate-allreduce-grads-in-fp32", "--initial-loss-scale",
                                        "4096"};

std::vector<std::string> run_flags(int64_t iters) {
  return testing::tiny_moe_flags() + testing::mock_run_flags(16, 2, 4, 100, iters, "3e-3") +
         std::vector<std::string>{"--moe-aux-loss-coeff", "1e-2"};
}

std::vector<train::StepResult> train_steps(const std::vector<std::string>& extra, int64_t iters) {
  testing::NullOut null;
  train::Trainer t(testing::small_config(run_flags(iters), extra), null.f, false);
  std::vector<train::StepResult> r;
  for (int64_t i = 0; i < iters; i++) r.push_back(t.train_step());
  return r;
}

// With fp32 main gradients and with Megatron's default under --fp16, fp16 main gradients.
TEST(TrainFp16, LossesTrackBf16Within1Percent) {
  const auto b = train_steps({"--bf16"}, 20);
  for (const bool fp32_main : {true, false}) {
    const auto h =
        train_steps(fp32_main ? kFp16 : std::vector<std::string>{"--fp16", "--initial-loss-scale", "4096"}, 20);
    const char* what = fp32_main ? "fp32 main gradients" : "fp16 main gradients";
    for (size_t i = 0; i < h.size(); i++) {
      EXPECT_FALSE(h[i].skipped) << what << " step " << i << ": 4096 should not overflow here";
      EXPECT_LT(std::abs(h[i].lm_loss - b[i].lm_loss), 1e-2 * b[i].lm_loss) << what << " step " << i;
    }
    EXPECT_LT(h.back().lm_loss, h.front().lm_loss) << what << ": fp16 should train";
  }
}

TEST(TrainFp16, FirstStepLossIsFp32sWithinF16Rounding) {
  const auto h = train_steps(kFp16, 1), f = train_steps({}, 1);
  // 11-bit significands: each rounding moves a value by at most 2^-11 relative; the loss sees many, mostly averaging.
  EXPECT_LT(std::abs(h[0].lm_loss - f[0].lm_loss), 2e-3 * f[0].lm_loss) << h[0].lm_loss << " vs " << f[0].lm_loss;
  EXPECT_NE(h[0].lm_loss, f[0].lm_loss) << "the fp16 run rounded nothing";
}

TEST(TrainFp16, GemmWeightsHeldInF16WithF32Masters) {
  testing::NullOut null;
  train::Trainer t(testing::small_config(run_flags(1), kFp16), null.f, false);
  int64_t f16 = 0, f32 = 0;
  for (const auto& p : t.params().all()) {
    (p->value.dtype() == DType::F16 ? f16 : f32)++;
    EXPECT_TRUE(p->value.dtype() == DType::F16 || p->value.dtype() == DType::F32) << p->name;
    EXPECT_EQ(p->value.dtype() == DType::F16, p->low_storage == DType::F16) << p->name;
    EXPECT_EQ(p->grad.dtype(), DType::F32) << p->name;  // fp32 main gradients
  }
  EXPECT_GT(f16, 0);
  EXPECT_GT(f32, 0);  // norms, router, embeddings stay f32
}

// No native 16-bit kernel on any CPU: every GEMM of an fp16 step is an f32 oneDNN product of widened operands, so
// MOECORE_MAX_CPU_ISA=avx2 takes the same path (its f32 kernels' own blocking aside).
TEST(TrainFp16, EveryGemmRunsOnWidenedF32Operands) {
  const auto before = kernels::gemm_shape_stats();
  train_steps(kFp16, 1);
  int64_t calls = 0;
  for (const auto& s : kernels::gemm_shape_stats()) {
    int64_t had = 0;
    for (const auto& b : before)
      if (b.describe() == s.describe()) had = b.calls;
    if (s.calls == had) continue;
    calls += s.calls - had;
    EXPECT_EQ(s.dtype, DType::F32) << s.describe();
    EXPECT_EQ(s.out, DType::F32) << s.describe();
  }
  EXPECT_GT(calls, 0);
}

TEST(TrainFp16, RerunIsBitwise) {
  const auto a = train_steps(kFp16, 4), b = train_steps(kFp16, 4);
  for (size_t i = 0; i < a.size(); i++) {
    EXPECT_EQ(a[i].lm_loss, b[i].lm_loss) << "step " << i;
    EXPECT_EQ(a[i].grad_norm, b[i].grad_norm) << "step " << i;
    EXPECT_EQ(a[i].loss_scale, b[i].loss_scale) << "step " << i;
  }
}

}  // namespace
}  // namespace moecore
