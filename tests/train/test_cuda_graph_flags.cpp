// Megatron's CUDA-graph flags (--cuda-graph-impl, the deprecated --enable-cuda-graph/--external-cuda-graph and
// --cuda-graph-scope, --cuda-graph-modules, --cuda-graph-warmup-steps, --optimizer-cuda-graph): accepted in every
// form Megatron accepts and listed without effect (moecore launches every step eagerly); each of Megatron's
// assertions on them refused before any work with Megatron's message and the flags named, and the nearby settings
// Megatron accepts accepted; the --device cuda path takes them too; and a run with them trains bitwise as without.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>

#include "config_util.h"
#include "moecore/device/device_select.h"
#include "moecore/train/config/config_validate.h"
#include "moecore/train/config/device_support.h"
#include "moecore/train/trainer.h"
#include "test_util.h"

namespace moecore {
namespace {

using testing::operator+;
using Args = std::vector<std::string>;

// Two MoE layers (4 experts, dropless), dropout 0.1 (Megatron's default), 3 steps.
Args graph_run() {
  return train::override_flags(testing::tiny_moe_flags() + testing::mock_run_flags(16, 2, 4, 64, 3, "1e-2"),
                               {"--hidden-dropout", "0.1", "--attention-dropout", "0.1"});
}

train::TrainConfig graph_config(const Args& extra) {
  return testing::small_config(graph_run(), extra);
}

std::string graph_error(const Args& extra) {
  return testing::user_error_of([&] { graph_config(extra); });
}

bool listed(const train::TrainConfig& c, const std::string& start) {
  for (const auto& l : c.no_effect)
    if (l.rfind(start, 0) == 0 && l.find("moecore launches every step eagerly") != std::string::npos) return true;
  return false;
}

// The refusal holds Megatron's message and names each of `flags`.
void expect_refused(const Args& extra, const std::string& megatron, const Args& flags) {
  const std::string e = graph_error(extra);
  EXPECT_NE(e.find(megatron), std::string::npos) << "expected Megatron's \"" << megatron << "\", got: " << e;
  EXPECT_NE(e.find("Megatron's rule"), std::string::npos) << e;
  for (const auto& f : flags) EXPECT_NE(e.find(f), std::string::npos) << f << " not named in: " << e;
}

void expect_accepted(const Args& extra) {
  std::string shown;
  for (const auto& a : extra) shown += " " + a;
  EXPECT_EQ(testing::error_of([&] { graph_config(extra); }), "") << "with" << shown;
}

const Args kTe = {"--cuda-graph-impl", "transformer_engine"};
const Args kLocal = {"--cuda-graph-impl", "local"};
const Args kFullIteration = {"--cuda-graph-impl", "full_iteration", "--no-check-for-nan-in-loss-and-grad"};
const Args kDropPad = {"--moe-expert-capacity-factor", "1.0", "--moe-pad-expert-input-to-capacity"};
const Args kNoDropout = {"--attention-dropout", "0", "--hidden-dropout", "0"};

TEST(CudaGraphFlags, EveryFormIsAcceptedAndListedWithoutEffect) {
  for (const char* impl : {"none", "local", "transformer_engine"})
    EXPECT_TRUE(listed(graph_config({"--cuda-graph-impl", impl}), std::string("--cuda-graph-impl ") + impl + ": "))
        << impl;
  EXPECT_TRUE(listed(graph_config(kFullIteration), "--cuda-graph-impl full_iteration: "));
  EXPECT_TRUE(listed(graph_config({"--enable-cuda-graph"}), "--enable-cuda-graph: Megatron's deprecated spellings"));
  EXPECT_TRUE(listed(graph_config({"--external-cuda-graph"}), "--external-cuda-graph: "));
  EXPECT_TRUE(listed(graph_config({"--cuda-graph-warmup-steps", "0"}), "--cuda-graph-warmup-steps 0: "));
  const auto opt = graph_config({"--optimizer-cuda-graph"});
  ASSERT_EQ(opt.no_effect.size(), 1u);
  EXPECT_EQ(opt.no_effect[0].rfind("--optimizer-cuda-graph: captures the optimizer step", 0), 0u);
  // Every module Megatron names, each where Megatron takes it, under --cuda-graph-modules and its deprecated name.
  const std::vector<Args> modules = {{"attn"},  {"moe_router"}, {"moe_router", "moe_preprocess"},
                                     {"mamba"}, {"full"},       {"full_iteration_inference"}};
  for (const char* flag : {"--cuda-graph-modules", "--cuda-graph-scope"})
    for (const Args& m : modules) {
      const auto c = graph_config(kLocal + kNoDropout + Args{flag} + m);
      std::string shown = flag;
      for (const auto& v : m) shown += " " + v;
      EXPECT_TRUE(listed(c, shown + ": what a CUDA graph captures")) << shown;
    }
  EXPECT_TRUE(listed(graph_config(kTe + Args{"--cuda-graph-modules", "mlp", "--moe-layer-freq", "[0,1]"}),
                     "--cuda-graph-modules mlp: "));
  EXPECT_TRUE(listed(graph_config(kTe + kDropPad + Args{"--cuda-graph-modules", "moe"}), "--cuda-graph-modules moe: "));
  // Deprecated full_iteration: --cuda-graph-impl full_iteration (with its rule on the NaN check).
  EXPECT_TRUE(listed(graph_config({"--cuda-graph-modules", "full_iteration", "--no-check-for-nan-in-loss-and-grad"}),
                     "--cuda-graph-modules full_iteration: "));
  // A YAML list takes the rules too.
  const std::string y = testing::fresh_temp_path("cuda_graph_yaml") + ".yaml";
  std::FILE* f = std::fopen(y.c_str(), "w");
  std::fputs("cuda_graph_impl: transformer_engine\ncuda_graph_modules: [attn, moe_router]\n", f);
  std::fclose(f);
  EXPECT_TRUE(listed(graph_config(kNoDropout + Args{"--config", y}), "--cuda-graph-modules attn moe_router: "));
  // Values Megatron's parser does not take: refused naming the flag and the value.
  EXPECT_NE(graph_error({"--cuda-graph-impl", "cudagraph"}).find("--cuda-graph-impl cudagraph: not a CUDA graph"),
            std::string::npos);
  EXPECT_NE(graph_error({"--cuda-graph-modules", "attn", "layer"}).find("--cuda-graph-modules layer: not a CUDA graph"),
            std::string::npos);
  EXPECT_NE(graph_error({"--cuda-graph-warmup-steps", "two"}).find("--cuda-graph-warmup-steps: invalid int value"),
            std::string::npos);
}

// validate_args (arguments.py) and cuda_graph_config.py: the deprecated forms and full_iteration.
TEST(CudaGraphFlags, MegatronsArgumentRulesAreRefusedWithItsMessages) {
  expect_refused({"--enable-cuda-graph", "--cuda-graph-impl", "local"},
                 "Do not use --enable-cuda-graph or --external-cuda-graph with --cuda-graph-impl.",
                 {"--cuda-graph-impl local"});
  expect_accepted({"--enable-cuda-graph", "--cuda-graph-impl", "none"});  // Megatron cannot tell none from unset
  expect_refused({"--enable-cuda-graph", "--external-cuda-graph"},
                 "--enable-cuda-graph and --external-cuda-graph cannot be enabled at the same time.", {});
  expect_refused(kTe + Args{"--cuda-graph-scope", "attn", "--cuda-graph-modules", "attn"},
                 "--cuda-graph-scope and --cuda-graph-modules cannot be used together.", {});
  expect_refused(kTe + Args{"--cuda-graph-modules", "full", "attn"}, "full scope cannot be used with other scopes.",
                 {"--cuda-graph-modules full attn"});
  expect_refused({"--cuda-graph-modules", "full_iteration", "full_iteration_inference"},
                 "cuda_graph_modules cannot contain multiple deprecated values at the same time: ['full_iteration', "
                 "'full_iteration_inference'].",
                 {"--cuda-graph-modules full_iteration full_iteration_inference"});
  expect_refused(kTe + Args{"--cuda-graph-modules", "full_iteration"},
                 "cuda_graph_modules='full_iteration' cannot be combined with cuda_graph_impl='transformer_engine'.",
                 {"--cuda-graph-impl transformer_engine", "--cuda-graph-modules full_iteration"});
  expect_refused(kTe + Args{"--cuda-graph-modules", "full_iteration_inference"},
                 "cuda_graph_modules='full_iteration_inference' cannot be combined with "
                 "cuda_graph_impl='transformer_engine'.",
                 {"--cuda-graph-impl transformer_engine"});
  expect_accepted({"--cuda-graph-modules", "full_iteration_inference"});  // no effect under impl none, as in Megatron
  expect_refused(
      {"--cuda-graph-impl", "full_iteration"},
      "--no-check-for-nan-in-loss-and-grad should be set with --cuda-graph-impl=full_iteration for training.",
      {"--cuda-graph-impl full_iteration"});
  expect_refused({"--enable-cuda-graph", "--cuda-graph-modules", "full_iteration"},  // migrated to full_iteration
                 "--no-check-for-nan-in-loss-and-grad should be set", {"--cuda-graph-modules full_iteration"});
  expect_refused(kFullIteration + Args{"--cuda-graph-modules", "attn"},
                 "--cuda-graph-modules must be empty when --cuda-graph-impl=full_iteration.",
                 {"--cuda-graph-modules attn"});
  expect_refused(kLocal + Args{"--cuda-graph-modules", "full_iteration_inference", "--bf16", "--fp8-format", "hybrid"},
                 "fp8 with --inference-cuda-graph-scope=block is only supported with "
                 "--transformer-impl=inference_optimized",
                 {"--fp8-format hybrid", "--cuda-graph-modules full_iteration_inference"});
}

// TransformerConfig.__post_init__: the modules against the model.
TEST(CudaGraphFlags, MegatronsModuleRulesAreRefusedWithItsMessages) {
  expect_refused(kTe + kDropPad + Args{"--cuda-graph-modules", "moe", "moe_router"},
                 "cuda_graph_modules must not contain both moe and moe_router.",
                 {"--cuda-graph-modules moe moe_router"});
  expect_refused(kTe + Args{"--cuda-graph-modules", "moe_preprocess"},
                 "moe_preprocess cuda graph is only supported with moe_router cuda graph.",
                 {"--cuda-graph-modules moe_preprocess"});
  expect_accepted(kLocal + Args{"--cuda-graph-modules", "moe_preprocess"});  // local captures moe_router with it
  expect_refused(kTe + Args{"--cuda-graph-modules", "moe_router", "--num-experts", "1", "--moe-router-topk", "1",
                            "--moe-router-pre-softmax"},
                 "moe cuda graph is only supported for MoE.", {"--num-experts 1"});
  expect_refused(kTe + Args{"--cuda-graph-modules", "mlp"},
                 "mlp cuda graph is only supported for dense layers, but not found in the model.",
                 {"--moe-layer-freq 1"});
  expect_refused(kTe + Args{"--cuda-graph-modules", "mlp", "--moe-layer-freq", "[1,1]"},
                 "mlp cuda graph is only supported for dense layers", {"[1,1] (no dense layer)"});
  expect_accepted(kTe + Args{"--cuda-graph-modules", "mlp", "--moe-layer-freq", "2"});  // an int other than 1
  expect_refused(kTe + Args{"--cuda-graph-modules", "moe"}, "moe cuda graph is only supported with drop-padding MoE.",
                 {"--cuda-graph-modules moe", "--moe-pad-expert-input-to-capacity"});
  expect_refused(
      kTe + Args{"--cuda-graph-modules", "moe_router", "moe_preprocess", "--moe-expert-capacity-factor", "1"},
      "moe_preprocess cuda graph is not supported when there are DtoH copies and synchronizations in the "
      "preprocess step.",
      {"--moe-expert-capacity-factor 1"});
  expect_accepted(kTe + kDropPad + Args{"--cuda-graph-modules", "moe_router", "moe_preprocess"});
}

// TransformerConfig.__post_init__: recompute and dropout inside graphs.
TEST(CudaGraphFlags, MegatronsRecomputeRulesAreRefusedWithItsMessages) {
  const Args full_recompute = {"--recompute-granularity", "full", "--recompute-method", "uniform",
                               "--recompute-num-layers",  "1"};
  expect_refused(kTe + full_recompute, "full recompute is only supported with full iteration CUDA graph.",
                 {"--recompute-granularity full"});
  expect_accepted(kFullIteration + full_recompute);
  expect_accepted(full_recompute);  // without graphs: no rule
  const Args moe_recompute = {"--recompute-granularity", "selective", "--recompute-modules", "moe"};
  expect_refused(
      kTe + moe_recompute + Args{"--cuda-graph-modules", "moe_router"},
      "moe recompute is not supported with moe_router CUDA graph with: --cuda-graph-impl transformer_engine.",
      {"--recompute-modules moe", "--cuda-graph-modules moe_router"});
  expect_accepted(kLocal + moe_recompute + Args{"--cuda-graph-modules", "moe_router"});  // local: no such rule
  // The default core_attn recompute with attention captured (dropout 0.1, Megatron's default).
  expect_refused(kTe + Args{"--recompute-activations", "--cuda-graph-modules", "attn"},
                 "attention dropout is not supported with graphed attention recomputation.",
                 {"--attention-dropout 0.1", "--recompute-modules core_attn", "--cuda-graph-modules attn"});
  expect_accepted(kTe + Args{"--recompute-activations", "--cuda-graph-modules", "attn", "--attention-dropout", "0"});
  expect_accepted(kTe + Args{"--recompute-activations", "--cuda-graph-modules", "moe_router"});
  expect_refused(kTe + moe_recompute + Args{"--attention-dropout", "0"},  // no modules: the whole layer
                 "hidden dropout is not supported with graphed MLP/MoE recomputation.",
                 {"--hidden-dropout 0.1", "no --cuda-graph-modules (the whole layer)"});
  expect_refused(kFullIteration + moe_recompute + kNoDropout + Args{"--moe-input-jitter-eps", "0.1"},
                 "moe_input_jitter_eps is not supported with graphed moe recomputation.", {"--moe-input-jitter-eps"});
  expect_accepted(kFullIteration + moe_recompute + kNoDropout);
}

// TransformerConfig.__post_init__: fine-grained activation offloading with graphs.
TEST(CudaGraphFlags, MegatronsOffloadingRulesAreRefusedWithItsMessages) {
  const Args offload = {"--fine-grained-activation-offloading", "--offload-modules"};
  expect_refused(kLocal + offload + Args{"core_attn", "expert_fc1", "--cuda-graph-modules", "attn"},
                 "fine-grained activation offloading with cuda_graph_impl='local' only supports offload_modules "
                 "'expert_fc1', 'moe_act', and 'fused_group_mlp'. Unsupported offload_modules: ['core_attn'].",
                 {"--offload-modules core_attn expert_fc1"});
  expect_refused(kLocal + offload + Args{"expert_fc1"},
                 "fine-grained activation offloading with cuda_graph_impl='local' is not supported with whole-layer "
                 "CUDA graph capture.",
                 {"no --cuda-graph-modules (the whole layer)"});
  expect_accepted(kLocal + offload + Args{"expert_fc1", "--cuda-graph-modules", "attn"});  // partial MoE offload
  expect_refused(kLocal + kDropPad + offload + Args{"expert_fc1", "--cuda-graph-modules", "moe"},
                 "fine-grained activation offloading is only supported with transformer_engine CUDA graph "
                 "implementation or local CUDA graph implementation with partial MoE offload.",
                 {"--cuda-graph-modules moe"});
  expect_refused(kTe + kDropPad + offload + Args{"core_attn", "--cuda-graph-modules", "moe"},
                 "Token-drop MoE is temporarily not supported with activation offloading.",
                 {"--cuda-graph-modules moe"});
  expect_refused(kTe + offload + Args{"core_attn", "--cuda-graph-warmup-steps", "0"},
                 "cuda_graph_warmup_steps must be greater than 0 when enabling fine-grained activation offloading.",
                 {"--cuda-graph-warmup-steps 0"});
  expect_refused(kFullIteration + offload + Args{"core_attn"},
                 "fine_grained_offloading_max_inflight_offloads must be a non-negative integer when using "
                 "fine-grained activation offloading with full-iteration CUDA graphs",
                 {"--fine-grained-offloading-max-inflight-offloads"});
  expect_accepted(kFullIteration + offload + Args{"core_attn", "--fine-grained-offloading-max-inflight-offloads", "0"});
  expect_accepted(kTe + offload + Args{"core_attn"});
}

// Rules on settings a one-rank run cannot hold (the overlaps need expert or data parallelism): validate_cuda_graph
// over a configuration with them set.
TEST(CudaGraphFlags, MegatronsOverlapRulesAreRefusedWithItsMessages) {
  auto refusal = [](train::TrainConfig c) { return testing::error_of([&] { train::validate_cuda_graph(c); }); };
  train::TrainConfig c = graph_config(kTe + Args{"--cuda-graph-modules", "mlp", "--moe-layer-freq", "[0,1]"});
  c.overlap_moe_expert_parallel_comm = true;
  EXPECT_NE(refusal(c).find("CUDA graph scope on moe and mlp is not supported with overlap_moe_expert_parallel_comm"),
            std::string::npos);
  c = graph_config(kLocal + Args{"--cuda-graph-modules", "attn"});
  c.overlap_moe_expert_parallel_comm = c.use_megatron_fsdp = true;
  EXPECT_NE(refusal(c).find("1F1B overlap with FSDP does not support per-layer CUDA graphs (cuda_graph_impl='local')"),
            std::string::npos);
  c.overlap_moe_expert_parallel_comm = false;
  EXPECT_EQ(refusal(c), "");
  // --delay-wgrad-compute with --overlap-grad-reduce and weight gradients inside the graphs.
  c = graph_config(kTe + kNoDropout + Args{"--cuda-graph-modules", "attn", "--no-gradient-accumulation-fusion"});
  c.delay_wgrad_compute = c.overlap_grad_reduce = true;
  const std::string e = refusal(c);
  EXPECT_NE(e.find("CUDA graph with delay_wgrad_compute requires gradient_accumulation_fusion to be enabled."),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("drop --no-gradient-accumulation-fusion"), std::string::npos) << e;
  c = graph_config(kTe + kNoDropout + Args{"--cuda-graph-modules", "attn"});
  c.delay_wgrad_compute = c.overlap_grad_reduce = true;
  EXPECT_EQ(refusal(c), "");  // --disable-bias-linear (tiny_moe_flags)
  c.disable_bias_linear = false;
  EXPECT_NE(refusal(c).find("CUDA graph with delay_wgrad_compute doesn't support attn bias for now."),
            std::string::npos);
  c.overlap_grad_reduce = false;
  EXPECT_EQ(refusal(c), "");
}

// PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True with TE graphs needs NCCL_GRAPH_REGISTER=0, as in Megatron.
TEST(CudaGraphFlags, MegatronsAllocatorEnvironmentRule) {
  const char* was_alloc = std::getenv("PYTORCH_CUDA_ALLOC_CONF");
  const char* was_reg = std::getenv("NCCL_GRAPH_REGISTER");
  const std::string alloc = was_alloc ? was_alloc : "", reg = was_reg ? was_reg : "";
  ::setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True", 1);
  ::unsetenv("NCCL_GRAPH_REGISTER");
  expect_refused(kTe,
                 "Setting NCCL_GRAPH_REGISTER=0 to avoid illegal memory access when using CUDA Graph with "
                 "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True.",
                 {"--cuda-graph-impl transformer_engine"});
  expect_accepted(kLocal);
  ::setenv("NCCL_GRAPH_REGISTER", "0", 1);
  expect_accepted(kTe);
  was_alloc ? ::setenv("PYTORCH_CUDA_ALLOC_CONF", alloc.c_str(), 1) : ::unsetenv("PYTORCH_CUDA_ALLOC_CONF");
  was_reg ? ::setenv("NCCL_GRAPH_REGISTER", reg.c_str(), 1) : ::unsetenv("NCCL_GRAPH_REGISTER");
}

std::vector<train::StepResult> train_steps(const Args& extra) {
  const train::TrainConfig c = graph_config(extra + Args{"--device", "cpu"});
  std::FILE* null = std::fopen("/dev/null", "w");
  std::vector<train::StepResult> steps;
  {
    train::Trainer t(c, null, false);
    for (int s = 0; s < 3; s++) steps.push_back(t.train_step());
  }
  std::fclose(null);
  return steps;
}

TEST(CudaGraphFlags, TrainsBitwiseAsWithoutAndTheGpuPathTakesThem) {
  const Args graphs = kTe + Args{"--cuda-graph-modules", "attn", "--attention-dropout", "0"};
  const auto a = train_steps({"--attention-dropout", "0"}), b = train_steps(graphs);
  ASSERT_EQ(a.size(), b.size());
  for (size_t s = 0; s < a.size(); s++) {
    EXPECT_EQ(a[s].lm_loss, b[s].lm_loss) << "step " << s;
    EXPECT_EQ(a[s].grad_norm, b[s].grad_norm) << "step " << s;
  }
  // --device cuda (a GPU assumed, as `moecore plan` does): no effect there too, nothing refused.
  for (const Args& g : {graphs, Args{"--enable-cuda-graph", "--optimizer-cuda-graph"}}) {
    train::TrainConfig c;
    EXPECT_EQ(testing::error_of([&] {
                c = train::compose_train_config(
                    train::parse_flags(train::override_flags(graph_run(), g + Args{"--device", "cuda"})), true);
                train::training_device(c, device::DeviceAvailability::assumed_for("cuda"));
              }),
              "");
    EXPECT_TRUE(listed(c, g[0]));
  }
}

}  // namespace
}  // namespace moecore
