// validate()'s checks of Megatron's CUDA-graph flags (see config_validate.h). moecore launches every step eagerly, on
// the CPU and the GPU: --cuda-graph-impl and its companions have no effect (megatron_flag_rules_more.cpp lists them),
// but what Megatron refuses with them is refused here too, before any work, with Megatron's message: validate_args
// (arguments.py: the deprecated switches and --cuda-graph-scope, the modules' normalization of cuda_graph_config.py,
// full_iteration, --delay-wgrad-compute's graphed wgrads, the allocator's environment), TransformerConfig.__post_init__
// (the modules against MoE, recompute, dropout, offloading and the EP overlap) and Megatron FSDP's adapter.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstdlib>
#include <set>
#include <string>
#include <vector>

#include "moecore/core/error.h"
#include "moecore/train/config/config_validate.h"
#include "moecore/train/config/megatron_flags.h"

namespace moecore::train {

namespace cuda_graph_checks {  // named: the unity build puts other files' helpers beside these

using Names = std::vector<std::string>;

std::string py_list(const Names& v) {  // Python's repr of a list of strings, as Megatron's messages print it
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "'" : ", '") + x + "'";
  return "[" + s + "]";
}

// Megatron's message, then the flags given and what to do: "<Megatron's message> (<what>; Megatron's rule)".
void require(bool ok, const std::string& megatron, const std::string& what) {
  MOE_CHECK(ok, "{} ({}; Megatron's rule, kept although CUDA graphs have no effect in moecore)", megatron, what);
}

// The CUDA-graph flags as Megatron sees them after validate_args' migrations.
struct CudaGraphs {
  std::string impl = "none";
  std::string impl_shown = "--cuda-graph-impl none";  // the flag that set it, for the messages
  Names modules;                                      // CudaGraphModule names; empty: the whole layer
  std::string modules_shown = "no --cuda-graph-modules (the whole layer)";
  bool inference_block = false;  // full_iteration_inference migrated to --inference-cuda-graph-scope block
  int64_t warmup_steps = 3;

  bool per_layer() const { return impl == "local" || impl == "transformer_engine"; }
  bool graphs(const char* m) const { return holds(modules, m); }
};

// The deprecated switches and --cuda-graph-scope, then normalize_cuda_graph_modules and its migrations.
CudaGraphs read_cuda_graphs(const TrainConfig& c) {
  CudaGraphs g;
  auto given = [&](const char* name) { return given_megatron_values(c.no_effect, name); };
  if (const auto impl = given("cuda-graph-impl"); impl && impl->size() == 1) {
    g.impl = (*impl)[0];
    g.impl_shown = "--cuda-graph-impl " + g.impl;
  }
  const bool enable = given("enable-cuda-graph").has_value(), external = given("external-cuda-graph").has_value();
  if (enable || external) {
    require(g.impl == "none", "Do not use --enable-cuda-graph or --external-cuda-graph with --cuda-graph-impl.",
            g.impl_shown + " with a deprecated switch for it: drop the switch");
    require(!(enable && external), "--enable-cuda-graph and --external-cuda-graph cannot be enabled at the same time.",
            "keep one: they select --cuda-graph-impl local and transformer_engine");
    g.impl = enable ? "local" : "transformer_engine";
    g.impl_shown = (enable ? "--enable-cuda-graph (--cuda-graph-impl " : "--external-cuda-graph (--cuda-graph-impl ") +
                   g.impl + ")";
  }
  Names raw = given("cuda-graph-modules").value_or(Names{});
  std::string raw_flag = "--cuda-graph-modules";
  if (const auto scope = given("cuda-graph-scope")) {
    require(raw.empty(), "--cuda-graph-scope and --cuda-graph-modules cannot be used together.",
            "--cuda-graph-scope is the deprecated name of --cuda-graph-modules: give one of them");
    raw = *scope;
    raw_flag = "--cuda-graph-scope";
  }
  if (!raw.empty()) g.modules_shown = raw_flag + " " + fmt::format("{}", fmt::join(raw, " "));
  if (holds(raw, "full")) {  // deprecated: the whole layer
    require(raw == Names{"full"}, "full scope cannot be used with other scopes.",
            g.modules_shown + ": drop full (no modules captures the whole layer)");
    return g;
  }
  Names deprecated;
  for (const auto& m : raw)
    (m == "full_iteration" || m == "full_iteration_inference" ? deprecated : g.modules).push_back(m);
  if (deprecated.empty()) return g;
  require(std::set<std::string>(deprecated.begin(), deprecated.end()).size() == 1,
          "cuda_graph_modules cannot contain multiple deprecated values at the same time: " + py_list(deprecated) + ".",
          g.modules_shown + ": keep one of them");
  if (deprecated[0] == "full_iteration") {
    require(g.impl == "none" || g.impl == "local" || g.impl == "full_iteration",
            "cuda_graph_modules='full_iteration' cannot be combined with cuda_graph_impl='" + g.impl + "'.",
            g.modules_shown + " with " + g.impl_shown + ": use --cuda-graph-impl full_iteration instead");
    g.impl = "full_iteration";
    g.impl_shown = g.modules_shown + " (--cuda-graph-impl full_iteration)";
  } else {
    require(g.impl == "none" || g.impl == "local",
            "cuda_graph_modules='full_iteration_inference' cannot be combined with cuda_graph_impl='" + g.impl + "'.",
            g.modules_shown + " with " + g.impl_shown + ": drop full_iteration_inference (an inference setting)");
    g.inference_block = g.impl == "local";
  }
  return g;
}

int64_t warmup_steps(const TrainConfig& c) {  // --cuda-graph-warmup-steps (argparse's type=int; default 3)
  const auto v = given_megatron_values(c.no_effect, "cuda-graph-warmup-steps");
  if (!v || v->size() != 1) return 3;
  const std::string& s = (*v)[0];
  size_t end = 0;
  int64_t n = 0;
  try {
    n = std::stoll(s, &end);
  } catch (const std::exception&) {
    end = 0;
  }
  MOE_CHECK(end == s.size() && !s.empty(), "--cuda-graph-warmup-steps: invalid int value: '{}'", s);
  return n;
}

// validate_args' rules (arguments.py), in its order.
void validate_args_rules(const TrainConfig& c, const CudaGraphs& g) {
  if (g.impl == "full_iteration")
    require(c.no_check_for_nan_in_loss_and_grad,
            "--no-check-for-nan-in-loss-and-grad should be set with --cuda-graph-impl=full_iteration for training.",
            g.impl_shown + ": add --no-check-for-nan-in-loss-and-grad");
  if (g.inference_block && !c.fp8_format.empty())
    require(false,
            "fp8 with --inference-cuda-graph-scope=block is only supported with --transformer-impl=inference_optimized",
            g.modules_shown + " with " + g.impl_shown + " selects it, with --fp8-format " + c.fp8_format +
                ": drop full_iteration_inference");
  // --delay-wgrad-compute with --overlap-grad-reduce: weight gradients inside a graphed scope (the TE version asked for
  // there is taken as present: moecore has no TE).
  const bool wgrad_in_graph =
      g.graphs("attn") ||
      (g.graphs("moe_router") && c.moe_shared_expert_intermediate_size > 0 && !c.moe_shared_expert_overlap);
  if (c.delay_wgrad_compute && c.overlap_grad_reduce && wgrad_in_graph) {
    require(!given_megatron_values(c.no_effect, "no-gradient-accumulation-fusion"),
            "CUDA graph with delay_wgrad_compute requires gradient_accumulation_fusion to be enabled. This is because "
            "the default gradient accumulation does not use static memory addresses, which breaks CUDA graph "
            "requirements.",
            "--delay-wgrad-compute --overlap-grad-reduce with " + g.modules_shown +
                ": drop --no-gradient-accumulation-fusion");
    if (g.graphs("attn"))
      require(c.disable_bias_linear, "CUDA graph with delay_wgrad_compute doesn't support attn bias for now.",
              "--delay-wgrad-compute --overlap-grad-reduce with " + g.modules_shown + ": add --disable-bias-linear");
  }
  if (g.impl == "transformer_engine") {
    const char* alloc = std::getenv("PYTORCH_CUDA_ALLOC_CONF");
    const char* reg = std::getenv("NCCL_GRAPH_REGISTER");
    require(std::string(alloc ? alloc : "").find("expandable_segments:True") == std::string::npos ||
                std::string(reg ? reg : "") == "0",
            "Setting NCCL_GRAPH_REGISTER=0 to avoid illegal memory access when using CUDA Graph with "
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True.",
            g.impl_shown + " with PYTORCH_CUDA_ALLOC_CONF=" + std::string(alloc ? alloc : "") +
                " in the environment: set NCCL_GRAPH_REGISTER=0");
  }
  require(!(g.impl == "full_iteration" && !g.modules.empty()),
          "--cuda-graph-modules must be empty when --cuda-graph-impl=full_iteration.",
          g.impl_shown + " with " + g.modules_shown + ": drop the modules");
}

// --moe-layer-freq 1 or a list without dense layers: Megatron's test for "no dense layer".
bool no_dense_layer(const TrainConfig& c) {
  const std::string& f = c.moe_layer_freq;
  if (!f.empty() && std::all_of(f.begin(), f.end(), [](char ch) { return ch >= '0' && ch <= '9'; }))
    return f.substr(std::min(f.find_first_not_of('0'), f.size())) == "1";  // the int 1
  const auto moe = moe::parse_moe_layer_freq(f, c.num_layers);
  return std::all_of(moe.begin(), moe.end(), [](bool b) { return b; });
}

// TransformerConfig.__post_init__: the per-layer modules against the model.
void module_rules(const TrainConfig& c, CudaGraphs& g) {
  if (g.impl == "local" && (g.graphs("moe_router") || g.graphs("moe_preprocess"))) {
    for (const char* m : {"moe_router", "moe_preprocess"})  // local captures both or neither
      if (!g.graphs(m)) g.modules.push_back(m);
  }
  const std::string with = g.impl_shown + " with " + g.modules_shown;
  require(!(g.graphs("moe") && g.graphs("moe_router")), "cuda_graph_modules must not contain both moe and moe_router.",
          with + ": keep one");
  if (g.graphs("moe_preprocess"))
    require(g.graphs("moe_router"), "moe_preprocess cuda graph is only supported with moe_router cuda graph.",
            with + ": add moe_router");
  if (c.num_experts <= 1) {
    require(!g.graphs("moe") && !g.graphs("moe_router"), "moe cuda graph is only supported for MoE.",
            with + fmt::format(" and --num-experts {}: drop moe and moe_router", c.num_experts));
    return;
  }
  if (g.graphs("mlp"))
    require(!no_dense_layer(c), "mlp cuda graph is only supported for dense layers, but not found in the model.",
            with + " and --moe-layer-freq " + c.moe_layer_freq + " (no dense layer): drop mlp");
  const bool capacity = c.moe_expert_capacity_factor >= 0;  // Megatron's None: dropless
  if (!capacity || !c.moe_pad_expert_input_to_capacity) {
    require(!g.graphs("moe"), "moe cuda graph is only supported with drop-padding MoE.",
            with + ": drop moe, or add --moe-expert-capacity-factor with --moe-pad-expert-input-to-capacity");
    if (c.moe_token_dispatcher_type == "alltoall" && capacity)
      require(!g.graphs("moe_preprocess"),
              "moe_preprocess cuda graph is not supported when there are DtoH copies and synchronizations in the "
              "preprocess step.",
              with + fmt::format(" and --moe-expert-capacity-factor {} with the alltoall dispatcher: drop "
                                 "moe_preprocess",
                                 c.moe_expert_capacity_factor));
  }
}

// TransformerConfig.__post_init__: selective recompute inside or around the graphed modules, and dropout in them.
void recompute_rules(const TrainConfig& c, const CudaGraphs& g) {
  if (c.recompute_granularity.empty()) return;
  if (c.recompute_granularity != "selective") {
    require(g.impl == "full_iteration", "full recompute is only supported with full iteration CUDA graph.",
            g.impl_shown + " with --recompute-granularity " + c.recompute_granularity +
                ": use --cuda-graph-impl full_iteration or selective recompute");
    return;
  }
  const Names rm = c.recompute_modules.empty() ? Names{"core_attn"} : c.recompute_modules;  // Megatron's default
  const std::string with =
      g.impl_shown + " with " + g.modules_shown + " and --recompute-modules " + fmt::format("{}", fmt::join(rm, " "));
  if (g.impl == "transformer_engine" && holds(rm, "moe"))
    require(!g.graphs("moe_router"),
            "moe recompute is not supported with moe_router CUDA graph with: --cuda-graph-impl transformer_engine.",
            with + ": drop moe_router or the moe recompute");
  const bool full = g.impl == "full_iteration" || g.modules.empty();  // the whole layer (or step) captured
  auto graphed = [&](const char* m) { return full || g.graphs(m); };
  if (c.attention_dropout != 0.0)
    require(!graphed("attn") || !holds(rm, "core_attn"),
            "attention dropout is not supported with graphed attention recomputation.",
            with + fmt::format(" and --attention-dropout {}: set --attention-dropout 0 or recompute core_attn outside "
                               "the graphs",
                               c.attention_dropout));
  if (c.hidden_dropout != 0.0)
    require((!graphed("mlp") || !holds(rm, "mlp")) && (!graphed("moe") || !holds(rm, "moe")),
            "hidden dropout is not supported with graphed MLP/MoE recomputation.",
            with + fmt::format(" and --hidden-dropout {}: set --hidden-dropout 0 or recompute mlp and moe outside the "
                               "graphs",
                               c.hidden_dropout));
  if (c.moe_input_jitter_eps > 0)  // 0: Megatron's None
    require(!graphed("moe") || !holds(rm, "moe"),
            "moe_input_jitter_eps is not supported with graphed moe recomputation.",
            with + " and --moe-input-jitter-eps: drop the jitter or the moe recompute");
}

// TransformerConfig.__post_init__: fine-grained activation offloading inside graphs.
void offloading_rules(const TrainConfig& c, const CudaGraphs& g) {
  if (!c.fine_grained_activation_offloading) return;
  const std::set<std::string> partial{"expert_fc1", "moe_act", "fused_group_mlp"};
  const std::set<std::string> offload(c.offload_modules.begin(), c.offload_modules.end());
  const std::string with = g.impl_shown + " with --fine-grained-activation-offloading --offload-modules " +
                           fmt::format("{}", fmt::join(c.offload_modules, " "));
  if (g.impl == "local") {
    Names unsupported;
    for (const auto& m : offload)
      if (!partial.count(m)) unsupported.push_back(m);  // sorted, as Megatron prints them
    require(unsupported.empty(),
            "fine-grained activation offloading with cuda_graph_impl='local' only supports offload_modules "
            "'expert_fc1', 'moe_act', and 'fused_group_mlp'. Unsupported offload_modules: " +
                py_list(unsupported) + ".",
            with + ": offload only those");
    require(!g.modules.empty(),
            "fine-grained activation offloading with cuda_graph_impl='local' is not supported with whole-layer CUDA "
            "graph capture.",
            with + " and " + g.modules_shown + ": name the --cuda-graph-modules");
  }
  const bool local_partial = g.impl == "local" && !offload.empty() &&
                             std::all_of(offload.begin(), offload.end(), [&](auto& m) { return partial.count(m); }) &&
                             !g.graphs("moe");
  require(g.impl == "transformer_engine" || g.impl == "full_iteration" || local_partial,
          "fine-grained activation offloading is only supported with transformer_engine CUDA graph implementation or "
          "local CUDA graph implementation with partial MoE offload. Local partial CUDA graphs are supported only for "
          "expert_fc1, moe_act, or fused_group_mlp offload when the full MoE module is not captured.",
          with + " and " + g.modules_shown + ": use --cuda-graph-impl transformer_engine");
  require(!g.graphs("moe"), "Token-drop MoE is temporarily not supported with activation offloading.",
          with + " and " + g.modules_shown + ": drop moe");
  require(g.warmup_steps > 0,
          "cuda_graph_warmup_steps must be greater than 0 when enabling fine-grained activation offloading.",
          with + fmt::format(" and --cuda-graph-warmup-steps {}: warm up at least one step", g.warmup_steps));
  if (g.impl == "full_iteration")
    require(c.fine_grained_offloading_max_inflight_offloads >= 0,  // -1: Megatron's None
            "fine_grained_offloading_max_inflight_offloads must be a non-negative integer when using fine-grained "
            "activation offloading with full-iteration CUDA graphs",
            with + ": set --fine-grained-offloading-max-inflight-offloads");
}

void check_all(const TrainConfig& c) {
  CudaGraphs g = read_cuda_graphs(c);
  g.warmup_steps = warmup_steps(c);
  validate_args_rules(c, g);
  if (g.impl == "none") return;  // TransformerConfig checks the rest only with graphs
  if (g.per_layer()) module_rules(c, g);
  recompute_rules(c, g);
  offloading_rules(c, g);
  if (c.overlap_moe_expert_parallel_comm && g.impl == "transformer_engine")
    require(!g.graphs("moe") && !g.graphs("mlp"),
            "CUDA graph scope on moe and mlp is not supported with overlap_moe_expert_parallel_comm",
            g.impl_shown + " with " + g.modules_shown + " and --overlap-moe-expert-parallel-comm: drop moe and mlp");
  // Megatron FSDP's adapter, as it wraps the model.
  if (c.overlap_moe_expert_parallel_comm && c.use_megatron_fsdp)
    require(!g.per_layer(),
            "1F1B overlap with FSDP does not support per-layer CUDA graphs (cuda_graph_impl='" + g.impl +
                "'). Use cuda_graph_impl='full_iteration' or disable CUDA graphs (cuda_graph_impl='none').",
            g.impl_shown + " with --use-megatron-fsdp and --overlap-moe-expert-parallel-comm");
}

}  // namespace cuda_graph_checks

void validate_cuda_graph(const TrainConfig& c) {
  cuda_graph_checks::check_all(c);
}

}  // namespace moecore::train
