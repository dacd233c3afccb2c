// Megatron FSDP (--use-megatron-fsdp) under every --data-parallel-sharding-strategy gives the distributed
// optimizer's run (no_shard: plain data parallelism's) bitwise, step by step (losses, aux losses, gradient norms,
// parameter norms but optim_grads_params', summed over shards: 1e-6), where the arithmetic is the same: one micro-batch
// per step, fp32 gradients. With several micro-batches optim_grads and optim_grads_params reduce every micro-batch's
// gradients (Megatron's order) and agree within 1e-6 relative. After every step no unit holds gathered parameters or
// whole gradients. Layouts: DP2, DP4, EP2×EDP2, TP2+SP×FSDP2, PP2×FSDP2 (and interleaved), CP2×FSDP2, HSDP 2×2
// (--num-distributed-optimizer-instances 2), with and without recompute, in f32 and bf16; and a checkpoint saved under
// FSDP loads into the distributed optimizer and back, bitwise.
#include <gtest/gtest.h>

#include <algorithm>

#include "config_util.h"
#include "layout_util.h"
#include "moecore/comm/process_group.h"
#include "moecore/train/trainer.h"
#include "test_util.h"

namespace moecore {
namespace {

using testing::operator+;

struct FsdpLayout {
  std::string name;
  int64_t world;
  std::vector<std::string> layout;  // the parallel layout (every run)
  int64_t dp;                       // its data-parallel size (the global batch: micro-batch 2 × dp × micro_batches)
  int64_t micro_batches = 1;
};

const std::vector<std::string> kFsdpStrategies{"no_shard", "optim", "optim_grads", "optim_grads_params"};

std::vector<std::string> fsdp_base(const FsdpLayout& l) {
  return testing::four_layer_moe_flags(3) +
         std::vector<std::string>{"--moe-token-dispatcher-type", "alltoall", "--log-params-norm", "--global-batch-size",
                                  std::to_string(2 * l.dp * l.micro_batches)} +
         l.layout;
}

// The flags without `flag` and its value.
std::vector<std::string> fsdp_without(std::vector<std::string> args, const std::string& flag) {
  const auto it = std::find(args.begin(), args.end(), flag);
  if (it != args.end()) args.erase(it, it + 2);
  return args;
}

class FsdpLayouts : public ::testing::TestWithParam<FsdpLayout> {};

TEST_P(FsdpLayouts, EveryStrategyEqualsTheDistributedOptimizer) {
  const comm::ProcessGroup w = comm::ProcessGroup::world();
  const FsdpLayout& l = GetParam();
  if (w.size() != l.world) GTEST_SKIP() << l.name << " runs on " << l.world << " ranks";
  const std::vector<std::string> base = fsdp_base(l);
  std::FILE* null = std::fopen("/dev/null", "w");
  std::vector<train::StepResult> dist, ddp;
  {
    train::Trainer t(testing::small_config(base + std::vector<std::string>{"--use-distributed-optimizer"}), null, false,
                     &w);
    for (int s = 0; s < 3; s++) dist.push_back(t.train_step());
    train::Trainer d(testing::small_config(fsdp_without(base, "--num-distributed-optimizer-instances")), null, false,
                     &w);
    for (int s = 0; s < 3; s++) ddp.push_back(d.train_step());
  }
  for (const std::string& strategy : kFsdpStrategies) {
    train::Trainer f(
        testing::small_config(base, {"--use-megatron-fsdp", "--data-parallel-sharding-strategy", strategy}), null,
        false, &w);
    const std::vector<train::StepResult>& want = strategy == "no_shard" ? ddp : dist;
    const bool reduced_per_micro_batch =
        l.micro_batches > 1 && (strategy == "optim_grads" || strategy == "optim_grads_params");
    for (int s = 0; s < 3; s++) {
      const train::StepResult r = f.train_step();
      EXPECT_EQ(f.optimizer().buckets_gathered(), 0u) << strategy << " step " << s;
      EXPECT_EQ(f.optimizer().grad_buckets_live(), 0u) << strategy << " step " << s;
      if (reduced_per_micro_batch) {
        testing::expect_same_step(want[s], r, s, 1e-6);
        continue;
      }
      EXPECT_EQ(r.lm_loss, want[s].lm_loss) << strategy << " step " << s;
      EXPECT_EQ(r.grad_norm, want[s].grad_norm) << strategy << " step " << s;
      EXPECT_EQ(r.aux_losses, want[s].aux_losses) << strategy << " step " << s;
      EXPECT_EQ(r.z_loss, want[s].z_loss) << strategy << " step " << s;
      // optim_grads_params sums the f32 parameters' squares over shards (no rank holds them whole): the logged
      // parameter norm to its last bits only.
      if (strategy == "optim_grads_params")
        EXPECT_NEAR(r.params_norm, want[s].params_norm, 1e-6 * want[s].params_norm) << strategy << " step " << s;
      else
        EXPECT_EQ(r.params_norm, want[s].params_norm) << strategy << " step " << s;
    }
  }
  std::fclose(null);
}

const std::vector<std::string> kFsdpFull{"--recompute-granularity", "full", "--recompute-method", "uniform",
                                         "--recompute-num-layers",  "2"};
const std::vector<std::string> kFsdpSelective{"--recompute-activations"};
const std::vector<std::string> kFsdpEP2{"--expert-model-parallel-size", "2"};
const std::vector<std::string> kFsdpTP2{"--tensor-model-parallel-size", "2", "--sequence-parallel"};
const std::vector<std::string> kFsdpPP2{"--pipeline-model-parallel-size", "2"};
const std::vector<std::string> kFsdpHSDP{"--num-distributed-optimizer-instances", "2"};
// GEMM weights stored in bf16, their fp32 masters sharded; fp32 main gradients (Megatron FSDP's auto would be bf16
// under --bf16: mpi/test_low_precision_grad_layouts.cpp), to compare with the distributed optimizer's.
const std::vector<std::string> kFsdpBf16{"--bf16", "--megatron-fsdp-main-grads-dtype", "fp32"};

INSTANTIATE_TEST_SUITE_P(
    Fsdp, FsdpLayouts,
    ::testing::Values(
        FsdpLayout{"DP2", 2, {}, 2}, FsdpLayout{"DP2FullRecompute", 2, kFsdpFull, 2},
        FsdpLayout{"DP2Selective", 2, kFsdpSelective, 2}, FsdpLayout{"DP2TwoMicroBatches", 2, {}, 2, 2},
        FsdpLayout{"EP2", 2, kFsdpEP2, 2}, FsdpLayout{"DP4", 4, {}, 4}, FsdpLayout{"DP4FullRecompute", 4, kFsdpFull, 4},
        FsdpLayout{"EP2xEDP2", 4, kFsdpEP2, 4}, FsdpLayout{"EP2xEDP2FullRecompute", 4, kFsdpEP2 + kFsdpFull, 4},
        FsdpLayout{"TP2SPxFSDP2", 4, kFsdpTP2, 2}, FsdpLayout{"TP2SPxFSDP2Selective", 4, kFsdpTP2 + kFsdpSelective, 2},
        FsdpLayout{"PP2xFSDP2", 4, kFsdpPP2, 2},
        FsdpLayout{"PP2xFSDP2FullRecompute", 4,
                   kFsdpPP2 + std::vector<std::string>{"--recompute-granularity", "full", "--recompute-method", "block",
                                                       "--recompute-num-layers", "2"},
                   2},
        FsdpLayout{"PP2xFSDP2FourMicroBatches", 4, kFsdpPP2, 2, 4}, FsdpLayout{"HSDP2x2", 4, kFsdpHSDP, 4},
        FsdpLayout{"HSDP2x2EP2", 4, kFsdpHSDP + kFsdpEP2, 4}, FsdpLayout{"DP2Bf16", 2, kFsdpBf16, 2},
        FsdpLayout{"EP2xEDP2Bf16", 4, kFsdpEP2 + kFsdpBf16, 4},
        FsdpLayout{"CP2xFSDP2", 4, {"--context-parallel-size", "2"}, 2},
        FsdpLayout{"VPP2xFSDP2", 4, kFsdpPP2 + std::vector<std::string>{"--num-virtual-stages-per-pipeline-rank", "2"},
                   2, 2}),
    [](const auto& info) { return info.param.name; });

// HSDP with the optimizer state sharded across the instances too (--outer-dp-sharding-strategy optim): the same
// update as the two-instance distributed optimizer's (each element of the norm summed once rather than once per
// instance: within 1e-6), and back to every rank whole after each step.
TEST(FsdpHsdp, OuterOptimEqualsTwoInstances) {
  const comm::ProcessGroup w = comm::ProcessGroup::world();
  if (w.size() != 4) GTEST_SKIP() << "runs on 4 ranks";
  std::FILE* null = std::fopen("/dev/null", "w");
  for (const auto& layout : {std::vector<std::string>{}, kFsdpEP2}) {
    const FsdpLayout l{"HSDP2x2", 4, kFsdpHSDP + layout, 4};
    train::Trainer dist(testing::small_config(fsdp_base(l), {"--use-distributed-optimizer"}), null, false, &w);
    train::Trainer outer(
        testing::small_config(fsdp_base(l), {"--use-megatron-fsdp", "--outer-dp-sharding-strategy", "optim"}), null,
        false, &w);
    for (int s = 0; s < 3; s++) {
      const train::StepResult a = dist.train_step(), b = outer.train_step();
      testing::expect_same_step(a, b, s, 1e-6);
      EXPECT_NEAR(b.params_norm, a.params_norm, 1e-6 * a.params_norm) << "step " << s;
    }
  }
  std::fclose(null);
}

// optim_grads_params' buffer and initialisation options change no bit: --fsdp-double-buffer (with full recompute of
// one and of two layers per chunk, and EP), --init-model-with-meta-device (each rank draws only its shards), the
// overlap flags.
TEST(FsdpOptions, DoubleBufferMetaInitAndOverlapChangeNoBit) {
  const comm::ProcessGroup w = comm::ProcessGroup::world();
  const FsdpLayout l{"DP", w.size(), kFsdpEP2, w.size()};
  const std::vector<std::string> base = fsdp_base(l);
  std::FILE* null = std::fopen("/dev/null", "w");
  std::vector<train::StepResult> want;
  {
    train::Trainer t(testing::small_config(base, {"--use-megatron-fsdp"}), null, false, &w);
    for (int s = 0; s < 3; s++) want.push_back(t.train_step());
  }
  const std::vector<std::vector<std::string>> options{{"--fsdp-double-buffer"},
                                                      {"--fsdp-double-buffer", "--recompute-granularity", "full",
                                                       "--recompute-method", "uniform", "--recompute-num-layers", "1"},
                                                      {"--fsdp-double-buffer", "--recompute-granularity", "full",
                                                       "--recompute-method", "uniform", "--recompute-num-layers", "2"},
                                                      {"--init-model-with-meta-device"},
                                                      {"--overlap-grad-reduce", "--overlap-param-gather"}};
  for (const auto& o : options) {
    train::Trainer t(testing::small_config(base, std::vector<std::string>{"--use-megatron-fsdp"} + o), null, false, &w);
    for (int s = 0; s < 3; s++) {
      const train::StepResult r = t.train_step();
      EXPECT_EQ(r.lm_loss, want[s].lm_loss) << o.front() << " step " << s;
      EXPECT_EQ(r.grad_norm, want[s].grad_norm) << o.front() << " step " << s;
      EXPECT_EQ(r.params_norm, want[s].params_norm) << o.front() << " step " << s;
      EXPECT_EQ(t.optimizer().buckets_gathered(), 0u) << o.front() << " step " << s;
    }
  }
  std::fclose(null);
}

// FSDP optim_grads_params → the distributed optimizer → FSDP again, through checkpoints: each resumed step equals the
// straight FSDP run's bitwise (with one micro-batch per step the two optimizers compute the same bits).
TEST(FsdpCheckpoints, FsdpToDistributedOptimizerAndBackBitwise) {
  const comm::ProcessGroup w = comm::ProcessGroup::world();
  if (w.size() != 2) GTEST_SKIP() << "runs on 2 ranks";
  const FsdpLayout l{"DP2", 2, kFsdpEP2, 2};
  const std::vector<std::string> base = fsdp_base(l) + std::vector<std::string>{"--train-iters", "4"};
  const std::vector<std::string> fsdp{"--use-megatron-fsdp", "--ckpt-format", "fsdp_dtensor"};
  const std::vector<std::string> dist{"--use-distributed-optimizer"};
  const std::string dir = testing::mpi_shared_dir(w, "fsdp_ckpt");
  const std::string a = dir + "/fsdp", b = dir + "/dist";
  std::FILE* null = std::fopen("/dev/null", "w");
  std::vector<train::StepResult> want;
  {
    train::Trainer straight(testing::small_config(base, fsdp), null, false, &w);
    for (int i = 0; i < 4; i++) want.push_back(straight.train_step());
  }
  {
    train::Trainer first(testing::small_config(base, fsdp + std::vector<std::string>{"--save", a}), null, false, &w);
    for (int i = 0; i < 2; i++) first.train_step();
    first.save_checkpoint();
  }
  {
    train::Trainer middle(testing::small_config(base, dist + std::vector<std::string>{"--load", a, "--save", b}), null,
                          false, &w);
    ASSERT_EQ(middle.iteration(), 2);
    const train::StepResult r = middle.train_step();
    EXPECT_EQ(r.lm_loss, want[2].lm_loss);
    EXPECT_EQ(r.grad_norm, want[2].grad_norm);
    // The distributed optimizer sums whole f32 parameters' squares, optim_grads_params its shards': the same norm to
    // its last bits (which bits differ depends on the compiler's summation).
    EXPECT_NEAR(r.params_norm, want[2].params_norm, 1e-6 * want[2].params_norm);
    middle.save_checkpoint();
  }
  train::Trainer last(testing::small_config(base, fsdp + std::vector<std::string>{"--load", b}), null, false, &w);
  ASSERT_EQ(last.iteration(), 3);
  const train::StepResult r = last.train_step();
  EXPECT_EQ(r.lm_loss, want[3].lm_loss);
  EXPECT_EQ(r.grad_norm, want[3].grad_norm);
  EXPECT_EQ(r.params_norm, want[3].params_norm);
  EXPECT_EQ(r.aux_losses, want[3].aux_losses);
  std::fclose(null);
  if (w.rank() == 0) std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace moecore
