// Megatron's fp16/bf16 main gradients (optim/low_precision_grads.h) at their rounding points, on values computed by
// hand (Python's struct 'e' half and a bf16 round-to-nearest-even of the f32 bits): two micro-batches accumulated
// into an fp16 (bf16) main gradient, one rounding after each, give other values than the f32 sum; an accumulation
// that passes fp16's range is inf, which the dynamic loss scaler then skips (no update, the scale backed off) while
// the same sums in f32 train; through the trainer, fp16 main gradients under --fp16 change the gradient norm from the
// fp32 ones within fp16's rounding, rerun bitwise, and an overflow is a skipped iteration in the log line.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "config_util.h"
#include "moecore/core/file.h"
#include "moecore/optim/chained_optimizer.h"
#include "moecore/optim/low_precision_grads.h"
#include "moecore/train/config/optimizer_config.h"
#include "moecore/train/trainer.h"
#include "test_util.h"

namespace moecore {
namespace {

using testing::operator+;

Tensor values(const std::vector<float>& v) {
  Tensor t = Tensor::empty({static_cast<int64_t>(v.size())}, DType::F32);
  for (size_t i = 0; i < v.size(); i++) t.data<float>()[i] = v[i];
  return t;
}

TEST(LowPrecisionGrads, RoundsToNearestEvenAndFp16OverflowsToInf) {
  Tensor t = values({1.0f + 0x1p-11f, 1.0f + 3 * 0x1p-11f, 65504.0f, 65520.0f, -70000.0f, 0x1p-25f, 0.1f});
  optim::round_to_dtype(t, DType::F16);
  const float* x = t.data<float>();
  EXPECT_EQ(x[0], 1.0f);                                    // a tie: to the even 1
  EXPECT_EQ(x[1], 1.0f + 0x1p-9f);                          // a tie: to the even 1 + 2^-9
  EXPECT_EQ(x[2], 65504.0f);                                // fp16's largest
  EXPECT_EQ(x[3], std::numeric_limits<float>::infinity());  // half an ulp above it: inf
  EXPECT_EQ(x[4], -std::numeric_limits<float>::infinity());
  EXPECT_EQ(x[5], 0.0f);         // half the smallest subnormal: to the even 0
  EXPECT_EQ(x[6], 0x1.998p-4f);  // 0.0999755859375
  Tensor b = values({1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, 70000.0f});
  optim::round_to_dtype(b, DType::BF16);
  EXPECT_EQ(b.data<float>()[0], 1.0f);
  EXPECT_EQ(b.data<float>()[1], 1.0f + 0x1p-6f);
  EXPECT_EQ(b.data<float>()[2], 70144.0f);  // bf16 has f32's range
  Tensor f = values({0.1f});
  optim::round_to_dtype(f, DType::F32);  // fp32 main gradients: nothing
  EXPECT_EQ(f.data<float>()[0], 0.1f);
}

// One parameter of 4 elements in a single-rank ChainedOptimizer whose main gradients are `main`.
struct OneParam {
  nn::ParamRegistry reg;
  nn::Parameter* p;
  std::unique_ptr<optim::ChainedOptimizer> opt;
  explicit OneParam(DType main, optim::GradScalerConfig scaler = {}) {
    p = &reg.add("w", Shape{4}, nn::InitRule::zeros());
    reg.initialize(1);
    reg.zero_grad();
    optim::OptimizerConfig cfg;
    cfg.clip_grad = 0;
    cfg.scaler = scaler;
    cfg.grad_precision = {main, main};
    opt = std::make_unique<optim::ChainedOptimizer>(
        std::vector<nn::Parameter*>{p}, 1, [](const nn::Parameter&) { return size_t{0}; }, optim::OptimizerGroups{},
        cfg);
  }
  // One micro-batch's backward adds g to the main gradient (f32, as a GEMM with beta 1), then reports it written.
  void micro_batch(const std::vector<float>& g) {
    float* x = p->grad_to_add().data<float>();
    for (size_t i = 0; i < g.size(); i++) x[i] += g[i];
    opt->micro_batch_grads_done(0);
  }
  float grad(int i) const { return p->grad.data<float>()[i]; }
};

TEST(LowPrecisionGrads, TwoMicroBatchesAccumulateInTheMainGradientsDtype) {
  const std::vector<float> mb1 = {1.0f, 1.0f, 0.1f, -2.5f}, mb2 = {3 * 0x1p-12f, 0x1p-12f, 0.2f, 1e-3f};
  OneParam fp16(DType::F16), bf16(DType::BF16), fp32(DType::F32);
  for (OneParam* o : {&fp16, &bf16, &fp32}) {
    o->micro_batch(mb1);
    o->micro_batch(mb2);
  }
  // By hand: round(round(mb1) + mb2), the f32 addition first.
  EXPECT_EQ(fp16.grad(0), 1.0009765625f);  // 0.75 ulp above 1: up
  EXPECT_EQ(fp16.grad(1), 1.0f);           // 0.25 ulp: lost
  EXPECT_EQ(fp16.grad(2), 0.300048828125f);
  EXPECT_EQ(fp16.grad(3), -2.498046875f);
  EXPECT_EQ(bf16.grad(0), 1.0f);
  EXPECT_EQ(bf16.grad(1), 1.0f);
  EXPECT_EQ(bf16.grad(2), 0.30078125f);
  EXPECT_EQ(bf16.grad(3), -2.5f);
  // The f32 sums (moecore's fp32 main gradients) differ from every one of them.
  EXPECT_EQ(fp32.grad(0), 1.000732421875f);
  EXPECT_EQ(fp32.grad(1), 1.000244140625f);
  EXPECT_EQ(fp32.grad(2), 0.1f + 0.2f);
  EXPECT_EQ(fp32.grad(3), -2.5f + 1e-3f);
  // The optimizer reads them as they are (f32): the norm of the rounded values.
  std::vector<double> none;
  const double want =
      std::sqrt(1.0009765625 * 1.0009765625 + 1.0 + 0.300048828125 * 0.300048828125 + 2.498046875 * 2.498046875);
  EXPECT_NEAR(*fp16.opt->finish_gradients(none, 1), want, 1e-12);
}

TEST(LowPrecisionGrads, Fp16OverflowIsInfAndTheDynamicScalerSkipsTheStep) {
  optim::GradScalerConfig s;
  s.kind = optim::GradScalerConfig::Kind::Dynamic;
  s.initial_scale = 4.0f;
  s.min_scale = 1.0f;
  s.hysteresis = 1;
  OneParam fp16(DType::F16, s), fp32(DType::F32, s);
  for (OneParam* o : {&fp16, &fp32}) {
    o->micro_batch({60000.0f, 1.0f, 0, 0});
    o->micro_batch({10000.0f, 1.0f, 0, 0});  // 70000 passes fp16's 65504
  }
  EXPECT_EQ(fp16.grad(0), std::numeric_limits<float>::infinity());
  EXPECT_EQ(fp32.grad(0), 70000.0f);
  std::vector<double> none;
  EXPECT_FALSE(std::isfinite(*fp16.opt->finish_gradients(none, 1)));
  EXPECT_TRUE(fp16.opt->skipped());
  EXPECT_EQ(fp16.opt->loss_scale(), 2.0f);  // hysteresis 1: backed off at once
  fp16.opt->step(1e-3, 1);
  EXPECT_EQ(fp16.p->value.data<float>()[0], 0.0f);  // a skipped step updates nothing
  EXPECT_TRUE(std::isfinite(*fp32.opt->finish_gradients(none, 1)));
  EXPECT_FALSE(fp32.opt->skipped());
  fp32.opt->step(1e-3, 1);
  EXPECT_NE(fp32.p->value.data<float>()[0], 0.0f);
}

std::vector<std::string> run_flags(int64_t iters) {
  return testing::tiny_moe_flags() + testing::mock_run_flags(16, 2, 4, 100, iters, "3e-3");
}

// Megatron's flag rules (arguments.py, optimizer_config.py) and the dtypes they give.
TEST(LowPrecisionGrads, FlagsAsMegatron) {
  auto cfg = [](const std::vector<std::string>& extra) { return testing::small_config(run_flags(2), extra); };
  auto main_of = [&](const std::vector<std::string>& extra) { return train::grad_precision(cfg(extra)).main; };
  auto error_of = [&](const std::vector<std::string>& extra) { return testing::user_error_of([&] { cfg(extra); }); };
  const std::vector<std::string> aware{"--use-precision-aware-optimizer", "--use-distributed-optimizer"};
  EXPECT_EQ(main_of({}), DType::F32);
  EXPECT_EQ(main_of({"--bf16"}), DType::F32);  // fp32 accumulation is --bf16's default
  EXPECT_EQ(main_of({"--bf16", "--grad-reduce-in-bf16"}), DType::BF16);
  EXPECT_EQ(train::grad_precision(cfg({"--bf16", "--grad-reduce-in-bf16"})).comm, DType::BF16);
  // --grad-reduce-in-bf16 turns accumulate_allreduce_grads_in_fp32 off, and is read under --bf16 only.
  EXPECT_EQ(main_of({"--bf16", "--grad-reduce-in-bf16", "--accumulate-allreduce-grads-in-fp32"}), DType::BF16);
  EXPECT_EQ(main_of({"--grad-reduce-in-bf16"}), DType::F32);
  EXPECT_EQ(main_of({"--fp16", "--grad-reduce-in-bf16"}), DType::F16);
  EXPECT_EQ(main_of({"--fp16"}), DType::F16);
  EXPECT_EQ(main_of({"--fp16", "--accumulate-allreduce-grads-in-fp32"}), DType::F32);
  EXPECT_EQ(main_of(std::vector<std::string>{"--bf16", "--main-grads-dtype", "bf16"} + aware), DType::BF16);
  EXPECT_TRUE(testing::contains(error_of({"--bf16", "--main-grads-dtype", "bf16"}),
                                "main_grads_dtype can only be fp32 when not using precision-aware optimizer"));
  EXPECT_TRUE(
      testing::contains(error_of(std::vector<std::string>{"--bf16", "--accumulate-allreduce-grads-in-fp32",
                                                          "--main-grads-dtype", "bf16"} +
                                 aware),
                        "--main-grads-dtype can only be fp32 when --accumulate-allreduce-grads-in-fp32 is set"));
  EXPECT_TRUE(testing::contains(error_of(std::vector<std::string>{"--fp16", "--main-grads-dtype", "bf16"} + aware),
                                "--main-grads-dtype bf16 without --bf16"));
  EXPECT_TRUE(testing::contains(error_of({"--fp16", "--optimizer", "muon"}), "--optimizer muon with fp16/bf16 main"));
}

// Through the trainer (4 micro-batches a step): --fp16 alone keeps fp16 main gradients, whose norm differs from the
// fp32 ones' (--accumulate-allreduce-grads-in-fp32) within fp16's rounding, bitwise the same on a rerun.
TEST(LowPrecisionGrads, Fp16MainGradientsThroughTheTrainer) {
  testing::NullOut null;
  auto steps = [&](const std::vector<std::string>& extra) {
    train::Trainer t(
        testing::small_config(run_flags(3), std::vector<std::string>{"--fp16", "--initial-loss-scale", "1024"} + extra),
        null.f, false);
    std::vector<train::StepResult> r;
    for (int i = 0; i < 3; i++) r.push_back(t.train_step());
    return r;
  };
  const auto low = steps({}), again = steps({}), fp32 = steps({"--accumulate-allreduce-grads-in-fp32"});
  EXPECT_EQ(low[0].lm_loss, fp32[0].lm_loss);  // the same first forward
  for (size_t i = 0; i < low.size(); i++) {
    EXPECT_FALSE(low[i].skipped) << "step " << i;
    EXPECT_EQ(low[i].lm_loss, again[i].lm_loss) << "step " << i;
    EXPECT_EQ(low[i].grad_norm, again[i].grad_norm) << "step " << i;
    EXPECT_NEAR(low[i].grad_norm, fp32[i].grad_norm, 2e-3 * fp32[i].grad_norm) << "step " << i;
  }
  EXPECT_NE(low[0].grad_norm, fp32[0].grad_norm) << "fp16 accumulation should change the norm's last bits";
}

// A loss scale whose scaled gradients overflow the fp16 main gradients: skipped iterations, counted in the log line.
TEST(LowPrecisionGrads, Fp16MainGradientOverflowIsASkippedIterationInTheLog) {
  const std::string out_path = testing::fresh_temp_path("low_precision_grads_out");
  const train::TrainConfig c = testing::small_config(
      run_flags(4), {"--fp16", "--initial-loss-scale", "1073741824", "--hysteresis", "1", "--log-interval", "4"});
  EXPECT_EQ(train::grad_precision(c).main, DType::F16);
  {
    std::FILE* out = std::fopen(out_path.c_str(), "w");
    train::Trainer t(c, out, false);
    t.run();
    std::fclose(out);
  }
  const std::string console = read_file(out_path, "the training log");
  const size_t at = console.find("number of skipped iterations:");
  ASSERT_NE(at, std::string::npos) << console;
  EXPECT_GE(std::stoll(console.substr(at + 29, 4)), 1) << console;
}

}  // namespace
}  // namespace moecore
