// Megatron's fp16 and bf16 main gradients (optim/low_precision_grads.h) across layouts: --fp16 without
// --accumulate-allreduce-grads-in-fp32 and --bf16 --grad-reduce-in-bf16, under plain data parallelism (DP2, DP4), the
// distributed optimizer (with --overlap-grad-reduce too), EP2, PP2 (the tied embedding's sum over the first and last
// stage in the low dtype), TP2 with sequence parallelism (the norms' sums over TP in it) and Megatron FSDP's
// optim_grads_params (whose auto gradient dtypes are the model's), train the one-rank run's losses and gradient
// norms within the low dtype's rounding (each layout accumulates different micro-batches before its reduction, in
// another order); a rerun is bitwise the same, and so is a resume; and the rounding is there: the fp32-main-gradient
// run's norms differ in their last bits.
#include <gtest/gtest.h>

#include <algorithm>

#include "config_util.h"
#include "layout_util.h"
#include "moecore/comm/process_group.h"
#include "moecore/optim/low_precision_grads.h"
#include "moecore/train/config/optimizer_config.h"
#include "moecore/train/trainer.h"
#include "test_util.h"

namespace moecore {
namespace {

using testing::operator+;

struct LowLayout {
  std::string name;
  int64_t world;
  std::vector<std::string> layout;
};

struct LowPrecision {
  std::string name;
  std::vector<std::string> flags;  // the precision's flags (every run)
  std::vector<std::string> fp32;   // what turns its main gradients back to fp32 without FSDP (the control), if any
  DType main;
  double rel;  // the layouts' agreement with one rank
};

const std::vector<std::string> kFsdp{"--use-megatron-fsdp", "--data-parallel-sharding-strategy", "optim_grads_params"};

// Measured (2026-11-29, 3 steps, every layout here): losses, aux and z losses and gradient norms within 4.2e-5 of the
// one-rank run's (fp16) and 1.9e-4 (bf16), the gradient norm the farthest; fp32 main gradients agree to 1e-5.
const std::vector<LowPrecision> kPrecisions{
    {"Fp16", {"--fp16", "--initial-loss-scale", "4096"}, {"--accumulate-allreduce-grads-in-fp32"}, DType::F16, 2e-4},
    {"Bf16", {"--bf16", "--grad-reduce-in-bf16"}, {}, DType::BF16, 1e-3}};

std::vector<std::string> low_base(const LowPrecision& p) {
  return testing::four_layer_moe_flags(5) +
         std::vector<std::string>{"--moe-token-dispatcher-type", "alltoall", "--log-params-norm"} + p.flags;
}

class LowPrecisionGradLayouts : public ::testing::TestWithParam<LowLayout> {};

TEST_P(LowPrecisionGradLayouts, AgreeWithOneRankRerunAndResumeBitwise) {
  const comm::ProcessGroup w = comm::ProcessGroup::world();
  const LowLayout& l = GetParam();
  if (w.size() != l.world) GTEST_SKIP() << l.name << " runs on " << l.world << " ranks";
  for (const LowPrecision& p : kPrecisions) {
    SCOPED_TRACE(p.name);
    const train::TrainConfig one = testing::small_config(low_base(p)),
                             multi = testing::small_config(low_base(p), l.layout);
    ASSERT_EQ(train::grad_precision(multi).main, p.main);
    ASSERT_EQ(train::grad_precision(one).main, p.main);
    testing::expect_same_steps(one, multi, w, 3, p.rel);
    // A rerun: bitwise. The fp32-main-gradient control: other last bits.
    std::FILE* null = std::fopen("/dev/null", "w");
    std::vector<train::StepResult> a, b, c;
    {
      train::Trainer t(multi, null, false, &w), u(multi, null, false, &w);
      for (int s = 0; s < 3; s++) {
        a.push_back(t.train_step());
        b.push_back(u.train_step());
      }
    }
    // Megatron FSDP reads its own dtype flags only.
    const bool fsdp = std::find(l.layout.begin(), l.layout.end(), "--use-megatron-fsdp") != l.layout.end();
    const std::vector<std::string> fp32 =
        fsdp ? std::vector<std::string>{"--megatron-fsdp-main-grads-dtype", "fp32"} : p.fp32;
    if (!fp32.empty()) {
      train::Trainer f(testing::small_config(low_base(p), l.layout + fp32), null, false, &w);
      for (int s = 0; s < 3; s++) c.push_back(f.train_step());
    }
    std::fclose(null);
    for (size_t s = 0; s < a.size(); s++) {
      EXPECT_FALSE(a[s].skipped) << "step " << s;
      EXPECT_EQ(a[s].lm_loss, b[s].lm_loss) << "step " << s;
      EXPECT_EQ(a[s].grad_norm, b[s].grad_norm) << "step " << s;
      EXPECT_EQ(a[s].params_norm, b[s].params_norm) << "step " << s;
    }
    if (!c.empty()) EXPECT_NE(a[0].grad_norm, c[0].grad_norm) << "low-precision main gradients should round the norm";
    const std::string dir = testing::mpi_shared_dir(w, "low_precision_" + l.name + p.name);
    testing::expect_bitwise_resume(
        [&](const std::vector<std::string>& extra) { return testing::small_config(low_base(p), l.layout + extra); },
        dir, w);
  }
}

INSTANTIATE_TEST_SUITE_P(
    LowPrecision, LowPrecisionGradLayouts,
    ::testing::Values(LowLayout{"DP2", 2, {}}, LowLayout{"DP2DistributedOptimizer", 2, {"--use-distributed-optimizer"}},
                      LowLayout{"EP2", 2, {"--expert-model-parallel-size", "2"}}, LowLayout{"DP2Fsdp", 2, kFsdp},
                      LowLayout{"DP2OverlapGradReduce", 2, {"--overlap-grad-reduce", "--use-distributed-optimizer"}},
                      LowLayout{"DP4", 4, {}}, LowLayout{"PP2xDP2", 4, {"--pipeline-model-parallel-size", "2"}},
                      LowLayout{"TP2SPxDP2", 4, {"--tensor-model-parallel-size", "2", "--sequence-parallel"}},
                      LowLayout{"EP2xEDP2DistributedOptimizer",
                                4,
                                {"--expert-model-parallel-size", "2", "--use-distributed-optimizer"}},
                      LowLayout{"DP4Fsdp", 4, kFsdp}),
    [](const auto& info) { return info.param.name; });

// The reductions themselves, on hand-picked values: every rank's 2^-11 added to rank 0's 1 in rank order, each
// partial sum rounded to fp16, is lost (ties to the even 1), while the f32 sum rounded once is not; the same on every
// rank, and the reduce-scatter's shard equals the all-reduce's.
TEST(LowPrecisionReductions, RankOrderWithEveryPartialSumRounded) {
  const comm::ProcessGroup w = comm::ProcessGroup::world();
  if (w.size() < 2) GTEST_SKIP() << "runs on 2 or more ranks";
  const int64_t n = w.size();
  Tensor t = Tensor::empty({n}, DType::F32);  // [1 + 2^-11 on rank 0's own element ...]
  for (int64_t i = 0; i < n; i++) t.data<float>()[i] = w.rank() == 0 ? 1.0f : 0x1p-11f;
  Tensor rs = t.clone();
  optim::low_precision_all_reduce(w, t, DType::F16, 1.0);
  optim::low_precision_reduce_scatter_in_place(w, rs, DType::F16, 1.0);
  for (int64_t i = 0; i < n; i++) EXPECT_EQ(t.data<float>()[i], 1.0f) << i;
  EXPECT_EQ(rs.data<float>()[w.rank()], 1.0f);
  // In f32 the 2^-11s survive: 1 + (n-1)·2^-11.
  Tensor f = Tensor::empty({1}, DType::F32);
  f.data<float>()[0] = w.rank() == 0 ? 1.0f : 0x1p-11f;
  optim::low_precision_all_reduce(w, f, DType::F32, 1.0);
  EXPECT_EQ(f.data<float>()[0], 1.0f + static_cast<float>(n - 1) * 0x1p-11f);
  // Pre-scaled by 1/n (Megatron's gradient_scaling_factor) in bf16: 3 on every rank averages to 3.
  Tensor s = Tensor::empty({1}, DType::F32);
  s.data<float>()[0] = 3.0f;
  optim::low_precision_all_reduce(w, s, DType::BF16, 1.0 / static_cast<double>(n));
  if ((n & (n - 1)) == 0) EXPECT_EQ(s.data<float>()[0], 3.0f);
}

}  // namespace
}  // namespace moecore
