// --fp8-param-gather on 2 ranks: the distributed optimizer at DP2 (also with --overlap-param-gather), Megatron FSDP
// optim_grads_params and no_shard at DP2, EP2, and TP2 with sequence parallelism (the weights' amaxes over TP).
// - The model's FP8 weights after each step are, bit for bit, the FP8 GEMM's own cast (Fp8Gemm::quantize) of the
//   gathered fp32 masters: tensorwise and blockwise from a fresh site, delayed with the scale the weight's history
//   gave; with and without --bf16 (Megatron casts the fp32 master, not its bf16 rounding).
// - The bytes all-gathered for them are one per element: the run's parameter all-gathers move 3 bytes an FP8 weight
//   element (its shard) fewer than the f32 run's.
// - Losses and gradient norms equal, bitwise, the run without --fp8-param-gather where that run's GEMMs cast the
//   same f32 weights at the same point (tensorwise and blockwise in f32: the weight is the master either way, its
//   scale the whole tensor's); reruns are bitwise; a resume is bitwise; DP2 agrees with one rank (the plain
//   optimizer, casting whole tensors) within FP8's tolerance.
#include <gtest/gtest.h>

#include <cstdio>

#include "config_util.h"
#include "layout_util.h"
#include "moecore/comm/process_group.h"
#include "moecore/kernels/fp8.h"
#include "moecore/nn/fp8_param.h"
#include "moecore/train/trainer.h"
#include "test_util.h"

namespace moecore {
namespace {

using testing::operator+;
using Args = std::vector<std::string>;

Args pg_base() {
  return testing::tiny_moe_flags() + testing::mock_run_flags(16, 2, 4, 128, 6, "1e-2") +
         Args{"--make-vocab-size-divisible-by", "64", "--device", "cpu", "--fp8-format", "e4m3"};
}

struct PgLayout {
  std::string name;
  Args layout;
};

const std::vector<PgLayout> kPgLayouts = {
    {"DP2", {"--use-distributed-optimizer"}},
    {"FSDP2",
     {"--use-distributed-optimizer", "--use-megatron-fsdp", "--data-parallel-sharding-strategy", "optim_grads_params"}},
    {"EP2", {"--use-distributed-optimizer", "--expert-model-parallel-size", "2"}},
    // With the other buckets' gathers overlapped with the next forward (the FP8 buckets' are gathered at the step).
    {"DP2_overlap", {"--use-distributed-optimizer", "--overlap-param-gather", "--overlap-grad-reduce"}},
    // Megatron FSDP no_shard: the replicated optimizer, each rank casting whole tensors, nothing gathered.
    {"FSDP2_no_shard",
     {"--use-distributed-optimizer", "--use-megatron-fsdp", "--data-parallel-sharding-strategy", "no_shard"}},
    // The weights' amaxes reduced over TP as the non-gathered cast reduces them (losses, resume; DP is one rank).
    {"TP2", {"--use-distributed-optimizer", "--tensor-model-parallel-size", "2", "--sequence-parallel"}},
};

std::vector<train::StepResult> run_steps(const train::TrainConfig& c, const comm::ProcessGroup& w, int steps) {
  testing::NullOut null;
  train::Trainer t(c, null.f, false, &w);
  std::vector<train::StepResult> out;
  for (int s = 0; s < steps; s++) out.push_back(t.train_step());
  return out;
}

class Fp8ParamGather : public ::testing::TestWithParam<PgLayout> {};

// The FP8 weights (resident under the distributed optimizer; FSDP frees them between units) against the GEMM's cast
// of the masters, and the bytes gathered.
TEST_P(Fp8ParamGather, WeightsAreTheGemmsCastOfTheMasters) {
  const comm::ProcessGroup w = comm::ProcessGroup::world();
  if (w.size() != 2) GTEST_SKIP() << "runs on 2 ranks";
  if (GetParam().name == "FSDP2") GTEST_SKIP() << "FSDP frees the weights after the step: see the losses test";
  if (GetParam().name == "TP2") GTEST_SKIP() << "a TP shard's scale is the whole tensor's: see the losses test";
  for (const Args& precision : {Args{}, Args{"--bf16"}}) {
    for (const std::string recipe : {"tensorwise", "delayed", "blockwise"}) {
      SCOPED_TRACE(recipe + (precision.empty() ? "" : " bf16"));
      const train::TrainConfig c = testing::small_config(
          pg_base(), GetParam().layout + precision + Args{"--fp8-recipe", recipe, "--fp8-param-gather"});
      testing::NullOut null;
      train::Trainer t(c, null.f, false, &w);
      for (int s = 0; s < 2; s++) t.train_step();
      std::vector<Tensor> masters;
      t.optimizer().gather_master(masters);
      const auto& all = t.params().all();
      int64_t fp8_params = 0;
      for (size_t i = 0; i < all.size(); i++) {
        const nn::Parameter& p = *all[i];
        if (!p.fp8) continue;
        fp8_params++;
        ASSERT_EQ(p.value.dtype(), DType::F32) << p.name;
        // One slice per expert ([E, rows, cols]) or the whole [rows, cols] weight.
        const bool experts = p.value.ndim() == 3;
        const int64_t slices = experts ? p.value.dim(0) : 1;
        const int64_t rows = experts ? p.value.dim(1) : p.value.dim(0), cols = p.value.dim(p.value.ndim() - 1);
        for (int64_t e = 0; e < slices; e++) {
          const Tensor m = masters[i].reshape({slices * rows, cols}).slice(e * rows, rows);
          const Tensor v = p.value.reshape({slices * rows, cols}).slice(e * rows, rows);
          Tensor want = Tensor::empty({rows, cols}, DType::F32);
          if (recipe == "delayed") {
            kernels::fp8_quantize_tensorwise(m, kernels::Fp8Format::E4M3, p.fp8->scales()[static_cast<size_t>(e)],
                                             want);
          } else {
            nn::Fp8Config fc;
            fc.recipe = nn::parse_fp8_recipe(recipe);
            nn::Fp8Gemm gemm(fc, p.name, nn::TPContext{});
            want = gemm.quantize(m, nn::Fp8Operand::Weight, false).q;
          }
          EXPECT_TRUE(testing::bitwise_equal(v, want)) << p.name << " slice " << e;
          EXPECT_FALSE(testing::bitwise_equal(v, m)) << p.name << " slice " << e;
        }
      }
      EXPECT_GT(fp8_params, 0);
      // The FP8 weights of every layer (tiny-moe: no --first-last-layers-bf16), the rest as they were.
      EXPECT_FALSE(t.params().get("decoder.final_layernorm.weight").fp8);
    }
  }
}

// All-gathered parameter bytes per step: with FP8 weights 3 bytes an owned element fewer than in f32.
TEST_P(Fp8ParamGather, GathersOneBytePerElement) {
  const comm::ProcessGroup w = comm::ProcessGroup::world();
  if (w.size() != 2) GTEST_SKIP() << "runs on 2 ranks";
  if (GetParam().name == "TP2" || GetParam().name == "FSDP2_no_shard") GTEST_SKIP() << "nothing gathered";
  auto gathered = [&](const Args& extra, double* fp8_elements, int64_t* fp8_params) {
    const train::TrainConfig c =
        testing::small_config(pg_base(), GetParam().layout + Args{"--fp8-recipe", "tensorwise"} + extra);
    testing::NullOut null;
    train::Trainer t(c, null.f, false, &w);
    t.train_step();
    comm::comm_counters().clear();
    t.train_step();
    double bytes = 0;
    for (const auto& [key, counter] : comm::comm_counters())
      if (key == "dp:all_gather" || key == "edp:all_gather")  // the optimizers' groups (dense, experts)
        bytes += counter.payload_bytes;
    *fp8_elements = 0;
    *fp8_params = 0;
    for (const auto& p : t.params().all()) {
      if (!p->fp8) continue;
      // Sharded over the 2 ranks of its group (dense over DP, experts over EDP: one rank, nothing gathered, under
      // EP2): each rank's share.
      if (p->expert_parallel && GetParam().name == "EP2") continue;
      *fp8_elements += static_cast<double>(p->value.numel()) / 2;
      ++*fp8_params;
    }
    return bytes;
  };
  double n = 0, unused = 0;
  int64_t params = 0, unused_params = 0;
  const double f32 = gathered({}, &unused, &unused_params), fp8 = gathered({"--fp8-param-gather"}, &n, &params);
  ASSERT_GT(n, 0);
  // Each bucket's share padded to whole words (up to 3 bytes) and its buckets padded to the group (4 bytes).
  const double passes = GetParam().name == "FSDP2" ? 2 : 1;  // FSDP gathers a unit for forward and for backward
  EXPECT_NEAR(f32 - fp8, passes * 3 * n, passes * 8.0 * static_cast<double>(params)) << "f32 " << f32 << " fp8 " << fp8;
}

// The reference: the run without --fp8-param-gather casts the same f32 weights (its masters) with the same scales
// at each forward, so in f32 its losses are these bitwise.
TEST_P(Fp8ParamGather, LossesEqualTheCastAtTheSamePointAndRerunBitwise) {
  const comm::ProcessGroup w = comm::ProcessGroup::world();
  if (w.size() != 2) GTEST_SKIP() << "runs on 2 ranks";
  for (const std::string recipe : {"tensorwise", "blockwise"}) {
    SCOPED_TRACE(recipe);
    const Args layout = GetParam().layout + Args{"--fp8-recipe", recipe};
    const auto want = run_steps(testing::small_config(pg_base(), layout), w, 4);
    const train::TrainConfig pg = testing::small_config(pg_base(), layout + Args{"--fp8-param-gather"});
    const auto got = run_steps(pg, w, 4), again = run_steps(pg, w, 4);
    for (size_t s = 0; s < want.size(); s++) {
      EXPECT_EQ(got[s].lm_loss, want[s].lm_loss) << "step " << s;
      // The norm's squares are summed per bucket, and the FP8 weights have buckets of their own: the last bits.
      EXPECT_NEAR(got[s].grad_norm, want[s].grad_norm, 1e-12 * want[s].grad_norm) << "step " << s;
      EXPECT_EQ(again[s].lm_loss, got[s].lm_loss) << "step " << s;
      EXPECT_EQ(again[s].grad_norm, got[s].grad_norm) << "step " << s;
    }
    EXPECT_LT(got.back().lm_loss, got.front().lm_loss);
  }
}

// Under --bf16 and delayed scaling the casts differ from the non-gathered run's: the fp32 master against its bf16
// rounding; under delayed scaling a weight is cast once per step with the scale its history held then (the first
// step with TE's initial scale 1, as an FP8 weight made at initialisation is), where the non-gathered run casts it
// every micro-batch, the history updated after each. Losses within FP8's tolerance of that run (3%; gradient norms
// 5%, measured up to 3.1% under TP2; delayed's 15%, measured up to 8%), and (tensorwise) every figure within 3% of
// one rank.
TEST_P(Fp8ParamGather, Bf16AndDelayedFollowTheOtherRunsAndOneRank) {
  const comm::ProcessGroup w = comm::ProcessGroup::world();
  if (w.size() != 2) GTEST_SKIP() << "runs on 2 ranks";
  for (const Args& recipe :
       {Args{"--fp8-recipe", "delayed", "--fp8-amax-history-len", "4"}, Args{"--fp8-recipe", "tensorwise", "--bf16"}}) {
    SCOPED_TRACE(recipe[1]);
    const Args pg = recipe + Args{"--fp8-param-gather"};
    const train::TrainConfig multi = testing::small_config(pg_base(), GetParam().layout + pg);
    const auto plain = run_steps(testing::small_config(pg_base(), GetParam().layout + recipe), w, 4);
    const auto got = run_steps(multi, w, 4);
    for (size_t s = 0; s < got.size(); s++) {
      EXPECT_NEAR(got[s].lm_loss, plain[s].lm_loss, 3e-2 * plain[s].lm_loss) << "step " << s;
      EXPECT_NEAR(got[s].grad_norm, plain[s].grad_norm, (recipe[1] == "delayed" ? 0.15 : 5e-2) * plain[s].grad_norm)
          << "step " << s;
    }
    // One rank: the plain optimizer (one process has no data-parallel group), casting each whole tensor. Not for
    // delayed scaling, whose input and gradient histories see a step's micro-batches on one rank but one per rank
    // under DP2 (amaxes are not reduced over DP: docs/differences.md), with or without FP8 weights.
    if (recipe[1] != "delayed")
      testing::expect_same_steps(testing::small_config(pg_base(), pg + Args{"--use-distributed-optimizer"}), multi, w,
                                 4, 3e-2);
  }
}

TEST_P(Fp8ParamGather, ResumeIsBitwise) {
  const comm::ProcessGroup w = comm::ProcessGroup::world();
  if (w.size() != 2) GTEST_SKIP() << "runs on 2 ranks";
  const std::string dir = testing::mpi_shared_dir(w, "fp8pg_" + GetParam().name);
  testing::expect_bitwise_resume(
      [&](const Args& extra) {
        return testing::small_config(
            pg_base(), GetParam().layout + Args{"--bf16", "--fp8-recipe", "tensorwise", "--fp8-param-gather"} + extra);
      },
      dir, w);
}

// On 4 ranks, Megatron FSDP's other ways of holding the owned shards: HSDP 2×2 with the state sharded across the
// instances too (the FP8 bytes of each instance's shard gathered from its owners first), DP4 with sharded
// initialisation and the double buffer, EP2×EDP2: losses bitwise those of the run casting the same f32 weights.
TEST(Fp8ParamGatherFsdp, OuterShardingMetaInitAndDoubleBufferCastTheSameWeights) {
  const comm::ProcessGroup w = comm::ProcessGroup::world();
  if (w.size() != 4) GTEST_SKIP() << "runs on 4 ranks";
  const Args fsdp = {"--use-distributed-optimizer", "--use-megatron-fsdp", "--global-batch-size", "8"};
  for (const Args& layout :
       {Args{"--num-distributed-optimizer-instances", "2", "--outer-dp-sharding-strategy", "optim"},
        Args{"--init-model-with-meta-device", "--fsdp-double-buffer"}, Args{"--expert-model-parallel-size", "2"}}) {
    SCOPED_TRACE(layout[0]);
    const Args run = fsdp + layout + Args{"--fp8-recipe", "blockwise"};
    const auto want = run_steps(testing::small_config(pg_base(), run), w, 3);
    const auto got = run_steps(testing::small_config(pg_base(), run + Args{"--fp8-param-gather"}), w, 3);
    for (size_t s = 0; s < want.size(); s++) {
      EXPECT_EQ(got[s].lm_loss, want[s].lm_loss) << "step " << s;
      EXPECT_NEAR(got[s].grad_norm, want[s].grad_norm, 1e-12 * want[s].grad_norm) << "step " << s;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(FP8, Fp8ParamGather, ::testing::ValuesIn(kPgLayouts),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace moecore
