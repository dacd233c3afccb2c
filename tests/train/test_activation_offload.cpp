// Fine-grained activation offloading (train/activation_offload.h) on the CPU, through its testing switch
// (--testing-offload-on-cpu: the same copy-out / copy-back steps, into a host pool of their own): the flags with
// Megatron's rules; bitwise the losses, grad norms and parameters of the run without offloading, for dense, MoE, MLA,
// bf16 and recompute configurations; and the allocator's live bytes after a forward lower by exactly the bytes the
// memory plan says are offloaded, which are the bytes copied.
#include <gtest/gtest.h>

#include <cstdio>

#include "config_util.h"
#include "moecore/core/allocator.h"
#include "moecore/nn/stash_bytes.h"
#include "moecore/train/activation_offload.h"
#include "moecore/train/memory_plan.h"
#include "moecore/train/model_builder.h"
#include "moecore/train/trainer.h"
#include "test_util.h"

namespace moecore {
namespace {

using testing::operator+;
using Args = std::vector<std::string>;

const Args kOffloadAll = testing::offload_all_modules_flags() + Args{"--testing-offload-on-cpu"};

Args offload_run() {
  return testing::tiny_moe_flags() + testing::mock_run_flags(16, 2, 4, 64, 3, "1e-2");
}

Args offload_dense_run() {
  return Args{"--num-layers",          "2", "--hidden-size", "32",
              "--num-attention-heads", "4", "--swiglu",      "--disable-bias-linear",
              "--ffn-hidden-size",     "64"} +
         testing::rmsnorm_rope_flags() + testing::mock_run_flags(16, 2, 4, 64, 3, "1e-2");
}

Args offload_mla_run() {
  return train::override_flags(offload_run(), {"--hidden-size", "64"}) + testing::small_mla_flags(true);
}

std::string offload_error(const Args& extra) {
  return testing::user_error_of([&] { testing::small_config(offload_run(), extra); });
}

TEST(ActivationOffloadFlags, MegatronRules) {
  const Args on = {"--fine-grained-activation-offloading"};
  EXPECT_NE(offload_error(on).find("needs --offload-modules"), std::string::npos);
  EXPECT_NE(offload_error(on + Args{"--offload-modules", "attn_proj"}).find("needs core_attn"), std::string::npos);
  EXPECT_NE(offload_error(on + Args{"--offload-modules", "mlp"}).find("--offload-modules"), std::string::npos);
  EXPECT_NE(offload_error(on + Args{"--offload-modules", "gdp_qkv"}).find("gated delta-net"), std::string::npos);
  EXPECT_NE(offload_error(on + Args{"--offload-modules", "moe_act", "--recompute-granularity", "selective",
                                    "--recompute-modules", "moe"})
                .find("--recompute-modules moe"),
            std::string::npos);
  EXPECT_NE(offload_error(on + Args{"--offload-modules", "fused_group_mlp"}).find("--use-transformer-engine-op-fuser"),
            std::string::npos);
  EXPECT_NE(
      offload_error(on + Args{"--offload-modules", "fused_group_mlp", "moe_act", "--use-transformer-engine-op-fuser"})
          .find("cannot be combined"),
      std::string::npos);
  EXPECT_NE(offload_error(on + Args{"--offload-modules", "core_attn", "--transformer-impl", "local"})
                .find("transformer_engine"),
            std::string::npos);
  EXPECT_NE(offload_error(on + Args{"--offload-modules", "core_attn", "--min-offloaded-tensor-size", "-1"})
                .find("--min-offloaded-tensor-size"),
            std::string::npos);
  // Without --fine-grained-activation-offloading Megatron reads none of the others.
  const train::TrainConfig off = testing::small_config(offload_run(), {"--offload-modules", "attn_proj"});
  ASSERT_EQ(off.no_effect.size(), 1u);
  EXPECT_NE(off.no_effect[0].find("read only with --fine-grained-activation-offloading"), std::string::npos);
  // On the CPU: accepted, listed once as having no effect (the copies only with the testing switch);
  // --delay-offload-until-cuda-graph has none without CUDA graphs.
  const train::TrainConfig c = testing::small_config(
      offload_run(),
      on + Args{"--offload-modules", "core_attn", "attn_proj", "--delay-offload-until-cuda-graph", "--device", "cpu"});
  int offload_lines = 0, delay_lines = 0;
  for (const auto& l : c.no_effect) {
    offload_lines += l.rfind("--fine-grained-activation-offloading:", 0) == 0;
    delay_lines += l.rfind("--delay-offload-until-cuda-graph:", 0) == 0;
  }
  EXPECT_EQ(offload_lines, 1);
  EXPECT_EQ(delay_lines, 1);
  EXPECT_FALSE(train::offload_config(c, Device::cpu()).modules.any());
  EXPECT_TRUE(train::offload_config(c, Device::cuda(0)).modules.core_attn);
  train::TrainConfig t = c;
  t.testing_offload_on_cpu = true;
  const train::OffloadConfig oc = train::offload_config(t, Device::cpu());
  EXPECT_TRUE(oc.modules.core_attn && oc.modules.attn_proj && !oc.modules.expert_fc1);
  EXPECT_EQ(oc.min_numel, 1024 * 1024);  // Megatron's default
  EXPECT_EQ(oc.max_inflight, 1);         // None
}

struct OffloadRun {
  std::vector<train::StepResult> steps;
  std::vector<Tensor> params;
  int64_t offloaded = 0, host_live = 0, pool_after_2 = 0, pool_after_3 = 0;
};

OffloadRun offload_train_run(const Args& base, const Args& extra) {
  const train::TrainConfig c = testing::small_config(base, extra + Args{"--device", "cpu"});
  std::FILE* null = std::fopen("/dev/null", "w");
  OffloadRun r;
  {
    train::Trainer t(c, null, false);
    for (int s = 0; s < 3; s++) {
      r.steps.push_back(t.train_step());
      if (t.activation_offload() && s >= 1)
        (s == 1 ? r.pool_after_2 : r.pool_after_3) = t.activation_offload()->host_pool_bytes();
    }
    for (const auto& p : t.params().all()) r.params.push_back(p->value.clone());
    if (t.activation_offload()) {
      r.offloaded = t.activation_offload()->offloaded_bytes();
      r.host_live = t.activation_offload()->host_live_bytes();
    }
  }
  std::fclose(null);
  return r;
}

void expect_same_offload_run(const Args& base, const Args& extra, const std::string& what) {
  const OffloadRun a = offload_train_run(base, extra), b = offload_train_run(base, extra + kOffloadAll);
  EXPECT_GT(b.offloaded, 0) << what;
  EXPECT_EQ(b.host_live, 0) << what << ": every offloaded tensor came back";
  EXPECT_EQ(b.pool_after_2, b.pool_after_3) << what << ": a steady-state step takes no new host memory";
  for (size_t s = 0; s < a.steps.size(); s++) {
    EXPECT_EQ(a.steps[s].lm_loss, b.steps[s].lm_loss) << what << " step " << s;
    EXPECT_EQ(a.steps[s].grad_norm, b.steps[s].grad_norm) << what << " step " << s;
    EXPECT_EQ(a.steps[s].aux_losses, b.steps[s].aux_losses) << what << " step " << s;
  }
  ASSERT_EQ(a.params.size(), b.params.size());
  for (size_t i = 0; i < a.params.size(); i++)
    EXPECT_TRUE(testing::bitwise_equal(a.params[i], b.params[i])) << what << " parameter " << i;
}

TEST(ActivationOffload, BitwiseLikeNoOffload) {
  expect_same_offload_run(offload_run(), {}, "MoE");
  expect_same_offload_run(offload_run(), {"--bf16"}, "MoE bf16");
  expect_same_offload_run(testing::layered_moe_flags() + testing::mock_run_flags(16, 2, 4, 64, 3, "1e-2"),
                          {"--hidden-dropout", "0.1", "--attention-dropout", "0.1"},
                          "dense + MoE layers, GQA, dropout");
  expect_same_offload_run(offload_dense_run(), {}, "dense");
  expect_same_offload_run(offload_mla_run(), {}, "MLA");
  expect_same_offload_run(
      offload_run(),
      {"--recompute-granularity", "selective", "--recompute-modules", "core_attn", "layernorm", "moe_act"},
      "selective recompute");
  expect_same_offload_run(
      offload_run(), {"--recompute-granularity", "full", "--recompute-method", "block", "--recompute-num-layers", "1"},
      "full recompute of the first layer");
}

// After a training forward and the last copies' release: the bytes the forward left live are the run's without
// offloading less exactly what the plan says one micro-batch offloads.
int64_t offload_live_after_forward(const train::TrainConfig& c, train::ActivationOffload* off, bool drain = true) {
  nn::ParamRegistry reg;
  const train::ParallelGroups g(c, nullptr);
  const int64_t padded = train::build_vocabulary(c).padded;
  const auto model = train::build_model(c, padded, reg, g);
  if (off) model->set_stash_offload(off);
  Tensor tokens = Tensor::empty({c.micro_batch_size, c.seq_length}, DType::I64);
  for (int64_t i = 0; i < tokens.numel(); i++) tokens.data<int64_t>()[i] = (i * 7 + 3) % 60;
  nn::GPTModel::Stash st = model->make_stash();
  const int64_t before = Allocator::instance().stats().live_bytes;
  model->forward(tokens, tokens, Tensor(), st);
  if (off && drain) off->drain();
  return Allocator::instance().stats().live_bytes - before;
}

void expect_offload_plan_counts(const Args& base, const Args& modules, const std::string& what) {
  const train::TrainConfig plain = testing::small_config(base, {"--device", "cpu"});
  const train::TrainConfig c = testing::small_config(base, modules + Args{"--device", "cpu"});
  offload_live_after_forward(plain, nullptr);  // once first: the kernels' caches filled
  const int64_t base_live = offload_live_after_forward(plain, nullptr);
  train::ActivationOffload off(train::offload_config(c, Device::cpu()), Device::cpu());
  const int64_t live = offload_live_after_forward(c, &off);
  const train::MemoryPlan p = train::plan_memory(c, train::build_vocabulary(c).padded, train::PlanLayout::from(c), 0);
  EXPECT_GT(p.offloaded, 0) << what;
  EXPECT_EQ(static_cast<double>(base_live - live), p.offloaded) << what;
  // The bytes copied: the tensors themselves, without the slack of the storage they view (the experts' padded rows).
  EXPECT_LE(static_cast<double>(off.offloaded_bytes()), p.offloaded) << what;
  EXPECT_GE(static_cast<double>(off.offloaded_bytes()), 0.5 * p.offloaded) << what;
  EXPECT_GT(p.host_offloaded, 0) << what;
  const train::MemoryPlan q =
      train::plan_memory(plain, train::build_vocabulary(c).padded, train::PlanLayout::from(plain), 0);
  EXPECT_NEAR(q.peak_activations - p.peak_activations, p.host_offloaded - p.offload_window, 1.0) << what;
}

TEST(ActivationOffload, LiveBytesDropByThePlannedOffload) {
  const Args all_modules = kOffloadAll;
  expect_offload_plan_counts(offload_run(), all_modules, "MoE, every module");
  expect_offload_plan_counts(offload_run() + Args{"--bf16"}, all_modules, "MoE bf16, every module");
  expect_offload_plan_counts(offload_mla_run(), all_modules, "MLA, every module");
  expect_offload_plan_counts(offload_dense_run(), all_modules, "dense, every module");
  expect_offload_plan_counts(offload_mla_run() + Args{"--recompute-granularity", "selective", "--recompute-modules",
                                                      "mla_up_proj", "layernorm"},
                             all_modules, "MLA with mla_up_proj and layernorm recompute");
  expect_offload_plan_counts(offload_mla_run() + Args{"--bf16", "--q-lora-rank", "0"}, all_modules,
                             "MLA bf16, no q LoRA");
  expect_offload_plan_counts(
      testing::layered_moe_flags() + testing::mock_run_flags(16, 2, 4, 64, 3, "1e-2") + Args{"--bf16"}, all_modules,
      "GQA with qk-norm, bf16");
  expect_offload_plan_counts(testing::layered_moe_flags() + testing::mock_run_flags(16, 2, 4, 64, 3, "1e-2"),
                             all_modules, "GQA with qk-norm, dense and MoE layers");
  const Args some = {"--fine-grained-activation-offloading",
                     "--offload-modules",
                     "core_attn",
                     "expert_fc1",
                     "--min-offloaded-tensor-size",
                     "0",
                     "--testing-offload-on-cpu"};
  expect_offload_plan_counts(offload_run(), some, "core_attn (o stays: proj holds it) and expert_fc1");
  expect_offload_plan_counts(
      offload_run() + Args{"--recompute-granularity", "selective", "--recompute-modules", "core_attn", "moe_act"}, some,
      "with selective recompute");
  // The threshold keeps the small tensors (the norms' statistics, lse) on the device.
  expect_offload_plan_counts(offload_run(), train::override_flags(all_modules, {"--min-offloaded-tensor-size", "512"}),
                             "threshold 512");
}

// --fine-grained-offloading-max-inflight-offloads: with 0 every layer's device memory goes as soon as its copy is
// queued; with Megatron's None (one layer here) the last layer's stays until the next offload, the backward or a
// drain: after a forward, the drop is the plan's less the last layer's offload.
TEST(ActivationOffload, InflightOffloadsHoldTheLastLayers) {
  const train::TrainConfig plain = testing::small_config(offload_run(), {"--device", "cpu"});
  offload_live_after_forward(plain, nullptr);
  const int64_t base = offload_live_after_forward(plain, nullptr);
  const train::TrainConfig c0 = testing::small_config(
      offload_run(), kOffloadAll + Args{"--fine-grained-offloading-max-inflight-offloads", "0", "--device", "cpu"});
  const train::TrainConfig c1 = testing::small_config(offload_run(), kOffloadAll + Args{"--device", "cpu"});
  const train::StageOffload planned =
      train::stage_offload(c0, train::build_vocabulary(c0).padded, train::PlanLayout::from(c0), 0);
  train::ActivationOffload off0(train::offload_config(c0, Device::cpu()), Device::cpu());
  EXPECT_EQ(static_cast<double>(base - offload_live_after_forward(c0, &off0, false)), planned.per_micro_batch);
  train::ActivationOffload off1(train::offload_config(c1, Device::cpu()), Device::cpu());
  const double held =
      planned.per_micro_batch - static_cast<double>(base - offload_live_after_forward(c1, &off1, false));
  EXPECT_GT(held, 0);
  EXPECT_LE(held, planned.largest_layer);
}

// The plan names the expert-parallel dispatcher's buffers, sized from the rows routed: T·K rows of H per rank for
// balanced routing (the counts exchanged first), not every token to every rank.
TEST(ActivationOffload, PlanNamesTheDispatchBuffers) {
  const train::TrainConfig c =
      testing::small_config(offload_run(), {"--expert-model-parallel-size", "2", "--device", "cpu"});
  const auto buffers = train::dispatch_buffers(c, train::PlanLayout::from(c, 2));
  const int64_t T = 16 * 2, K = 2, H = 32;
  bool received = false;
  for (const auto& b : buffers)
    if (b.name.find("rows received [R, H]") != std::string::npos) {
      received = true;
      EXPECT_EQ(b.bytes, static_cast<double>(nn::tensor_bytes(T * K * H, DType::F32)));
    }
  EXPECT_TRUE(received);
  EXPECT_TRUE(
      train::dispatch_buffers(testing::small_config(offload_run(), {"--device", "cpu"}), train::PlanLayout{}).empty());
  const train::TrainConfig g = testing::small_config(
      offload_run(),
      {"--expert-model-parallel-size", "2", "--moe-token-dispatcher-type", "allgather", "--device", "cpu"});
  const auto gathered = train::dispatch_buffers(g, train::PlanLayout::from(g, 2));
  ASSERT_FALSE(gathered.empty());
  EXPECT_EQ(gathered[0].bytes, static_cast<double>(nn::tensor_bytes(2 * T * H, DType::F32)));
}

}  // namespace
}  // namespace moecore
