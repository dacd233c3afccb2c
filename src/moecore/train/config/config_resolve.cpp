// The two passes that make a parsed configuration usable (see config.h): resolve_defaults fills the values Megatron
// derives from others (each recorded, so a later pass derives it again), validate checks everything and changes
// nothing. resolve runs both and stamps the result; the Trainer takes only stamped, unchanged configurations.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <utility>

#include "moecore/ckpt/foreign_checkpoint.h"
#include "moecore/core/error.h"
#include "moecore/device/device_select.h"
#include "moecore/optim/newton_schulz.h"
#include "moecore/train/config/config.h"
#include "moecore/train/config/context_parallel.h"
#include "moecore/train/config/device_support.h"
#include "moecore/train/pipeline/pipeline_layout.h"
#include "moecore/train/pipeline/pipeline_stages.h"
#include "moecore/train/signals.h"

namespace moecore::train {

namespace {
constexpr const char* kUpProjNoEffect =
    "--recompute-modules mla_up_proj: recomputes Multi-Latent Attention's up projections, and this model has none "
    "(as in Megatron)";

// Lists `line` with the Megatron flags that have no effect, once however often resolve runs.
void note_no_effect(TrainConfig& c, const std::string& line) {
  if (std::find(c.no_effect.begin(), c.no_effect.end(), line) == c.no_effect.end()) c.no_effect.push_back(line);
}
}  // namespace

namespace {

uint64_t fingerprint(const TrainConfig& c) {
  const uint64_t h = std::hash<std::string>{}(config_json(c).dump());
  return h != 0 ? h : 1;  // 0 means never resolved
}

bool was_derived(const TrainConfig& c, const std::string& flag) {
  for (const auto& [name, value] : c.derived)
    if (name == flag) return true;
  return false;
}

// Megatron's checks on sample- vs iteration-based training, the warmup forms, the weight-decay schedule and the
// scheduler's resume flags; per-token loss and the EOD mask.
void validate_schedule_flags(const TrainConfig& c) {
  if (c.train_samples > 0 && !c.skip_train) {
    MOE_CHECK(was_derived(c, "train-iters"),
              "--train-iters {} and --train-samples {} are exclusive: give one (iterations follow from samples / "
              "--global-batch-size)",
              c.train_iters, c.train_samples);
    MOE_CHECK(c.lr_decay_iters == 0, "--lr-decay-iters {} with --train-samples: use --lr-decay-samples",
              c.lr_decay_iters);
    MOE_CHECK(c.lr_warmup_iters == 0, "--lr-warmup-iters {} with --train-samples: use --lr-warmup-samples",
              c.lr_warmup_iters);
    MOE_CHECK(c.lr_wsd_decay_iters == 0, "--lr-wsd-decay-iters {} with --train-samples: use --lr-wsd-decay-samples",
              c.lr_wsd_decay_iters);
    MOE_CHECK(c.lr_warmup_fraction < 0 || c.lr_warmup_samples == 0,
              "--lr-warmup-fraction {} and --lr-warmup-samples {} are exclusive: give one", c.lr_warmup_fraction,
              c.lr_warmup_samples);
    MOE_CHECK(c.train_samples >= c.global_batch_size,
              "--train-samples {} is less than one global batch (--global-batch-size {}): no iteration to train",
              c.train_samples, c.global_batch_size);
  } else if (!c.skip_train) {
    MOE_CHECK(c.lr_decay_samples == 0,
              "--lr-decay-samples {} needs --train-samples (with --train-iters use "
              "--lr-decay-iters)",
              c.lr_decay_samples);
    MOE_CHECK(c.lr_warmup_samples == 0,
              "--lr-warmup-samples {} needs --train-samples (with --train-iters use "
              "--lr-warmup-iters)",
              c.lr_warmup_samples);
    MOE_CHECK(c.lr_wsd_decay_samples == 0,
              "--lr-wsd-decay-samples {} needs --train-samples (with --train-iters use "
              "--lr-wsd-decay-iters)",
              c.lr_wsd_decay_samples);
    MOE_CHECK(c.lr_warmup_fraction < 0 || c.lr_warmup_iters == 0,
              "--lr-warmup-fraction {} and --lr-warmup-iters {} are exclusive: give one", c.lr_warmup_fraction,
              c.lr_warmup_iters);
  }
  MOE_CHECK(c.lr_warmup_fraction == -1 || (c.lr_warmup_fraction >= 0 && c.lr_warmup_fraction < 1),
            "--lr-warmup-fraction {} must be in [0, 1) (-1: unset)", c.lr_warmup_fraction);
  for (auto [v, name] :
       {std::pair{c.train_iters, "train-iters"}, std::pair{c.lr_decay_iters, "lr-decay-iters"},
        std::pair{c.lr_warmup_iters, "lr-warmup-iters"}, std::pair{c.lr_wsd_decay_iters, "lr-wsd-decay-iters"}}) {
    int64_t product = 0;
    MOE_CHECK(!__builtin_mul_overflow(v, c.global_batch_size, &product),
              "--{} {} x --global-batch-size {} samples (the scheduler counts samples) do not fit in 64 bits", name, v,
              c.global_batch_size);
  }
  if (c.weight_decay_incr_style == "constant") {
    MOE_CHECK(c.start_weight_decay == -1 && c.end_weight_decay == -1,
              "--start-weight-decay/--end-weight-decay need --weight-decay-incr-style linear or cosine (constant "
              "uses --weight-decay)");
  } else {
    MOE_CHECK(c.start_weight_decay >= 0 && c.end_weight_decay >= 0,
              "--weight-decay-incr-style {} needs --start-weight-decay and --end-weight-decay (>= 0)",
              c.weight_decay_incr_style);
  }
  MOE_CHECK(!(c.use_checkpoint_opt_param_scheduler && c.override_opt_param_scheduler),
            "--use-checkpoint-opt_param-scheduler and --override-opt_param-scheduler are exclusive: the schedule "
            "comes from the checkpoint or from the flags");
  MOE_CHECK(!c.eod_mask_loss || !c.tokenizer_type.empty(),
            "--eod-mask-loss needs a --tokenizer-type (the tokenizer names the end-of-document token)");
}

// Pipeline parallelism: Megatron's stage-split checks (train/pipeline_layout.cpp), and what moecore cannot do
// under it.
void check_pipeline_flags(const TrainConfig& c) {
  const int64_t P = c.pipeline_model_parallel_size;
  for (const StageLayers& st : plan_pipeline(pipeline_flags(c)).stages)
    MOE_CHECK(st.mtp_layers == 0 || st.loss,
              "--pipeline-model-parallel-layout {} puts MTP layers (m) on a stage without the loss (L); moecore runs "
              "MTP on the loss stage: move m next to L",
              c.pipeline_model_parallel_layout);
  if (P == 1) return;
  MOE_CHECK(c.generate_prompts.empty(),
            "--generate-prompts with --pipeline-model-parallel-size {}: generation at the end of training runs the "
            "whole model on one rank; drop --generate-prompts and sample from the saved checkpoint with `moecore "
            "generate`",
            P);
}
}  // namespace

void resolve_defaults(TrainConfig& c) {
  const TrainConfig defaults;
  // A value an earlier pass derived goes back to "unset", so changed inputs derive it anew; one set since stays.
  for (const auto& [name, value] : c.derived) {
    const FlagSpec* f = find_flag(name);
    MOE_ASSERT(f != nullptr);
    const auto field = std::get<int64_t TrainConfig::*>(f->field);
    if (c.*field == value) c.*field = defaults.*field;
  }
  c.derived.clear();
  auto derive = [&](int64_t TrainConfig::*field, int64_t value) {
    const FlagSpec& f = flag_of(field);
    MOE_ASSERT(f.roles & kDerived);
    c.*field = value;
    c.derived.emplace_back(f.name, value);
  };
  const int64_t heads = c.num_attention_heads;
  if (c.kv_channels == 0 && heads > 0 && c.hidden_size % heads == 0)
    derive(&TrainConfig::kv_channels, c.hidden_size / heads);
  if (!c.group_query_attention) derive(&TrainConfig::num_query_groups, heads);
  if (c.ffn_hidden_size == 0 && c.hidden_size > 0) {  // a non-positive --hidden-size is refused by validate
    MOE_CHECK(c.hidden_size <= std::numeric_limits<int64_t>::max() / 8,
              "--hidden-size {} is too large: the default --ffn-hidden-size (4 x it) overflows", c.hidden_size);
    derive(&TrainConfig::ffn_hidden_size, c.swiglu ? (4 * c.hidden_size * 2 / 3) / 64 * 64 : 4 * c.hidden_size);
  }
  if (c.max_position_embeddings == 0) derive(&TrainConfig::max_position_embeddings, c.seq_length);
  if (c.expert_tensor_parallel_size == 0)
    derive(&TrainConfig::expert_tensor_parallel_size, c.tensor_model_parallel_size);
  if (c.global_batch_size == 0) derive(&TrainConfig::global_batch_size, c.micro_batch_size);  // x DP 1 here
  // Sample-based training (Megatron's update_train_iters): the iterations follow from the samples.
  if (c.train_samples > 0 && c.train_iters == 0 && c.global_batch_size > 0)
    derive(&TrainConfig::train_iters, c.train_samples / c.global_batch_size);
  if (c.train_samples == 0 && c.lr_decay_iters == 0) derive(&TrainConfig::lr_decay_iters, c.train_iters);
  if (c.train_samples > 0 && c.lr_decay_samples == 0) derive(&TrainConfig::lr_decay_samples, c.train_samples);
  if (c.num_experts > 0 && c.moe_ffn_hidden_size == 0) derive(&TrainConfig::moe_ffn_hidden_size, c.ffn_hidden_size);
  // Activation recompute, as Megatron rewrites it: --recompute-activations is selective granularity;
  // --moe-layer-recompute adds moe to the modules (the default core_attn included) unless granularity is full.
  if (c.recompute_activations) c.recompute_granularity = "selective";
  if (c.moe_layer_recompute && c.recompute_granularity != "full") {
    c.recompute_granularity = "selective";
    if (c.recompute_modules.empty()) c.recompute_modules = {"core_attn"};
    if (std::find(c.recompute_modules.begin(), c.recompute_modules.end(), "moe") == c.recompute_modules.end())
      c.recompute_modules.push_back("moe");
  }
}

namespace {
// Megatron's recompute checks (TransformerConfig.__post_init__, arguments.py), its messages' substance kept.
void validate_recompute(const TrainConfig& c) {
  const std::string& g = c.recompute_granularity;
  MOE_CHECK(!c.moe_layer_recompute || g != "full",
            "--moe-layer-recompute with --recompute-granularity full: Megatron refuses it (do not set "
            "--moe-layer-recompute with full recompute granularity); drop one of them");
  if (g == "full") {
    MOE_CHECK(!c.recompute_method.empty(),
              "--recompute-granularity full needs --recompute-method uniform or block (which layers to recompute)");
    MOE_CHECK(c.recompute_num_layers > 0,
              "--recompute-granularity full needs --recompute-num-layers between 1 and the layers per pipeline stage "
              "({})",
              c.num_layers / std::max<int64_t>(c.pipeline_model_parallel_size, 1));
    MOE_CHECK(c.mtp_num_layers == 0 || c.recompute_method != "uniform" || c.recompute_num_layers == 1,
              "--recompute-method uniform --recompute-num-layers {} with --mtp-num-layers {}: Megatron's MTP "
              "recompute needs --recompute-num-layers 1 (it asserts \"recompute_num_layers must be 1 for MTP "
              "recompute\"); use --recompute-num-layers 1, or --recompute-method block (which does not recompute "
              "the MTP layers)",
              c.recompute_num_layers, c.mtp_num_layers);
  }
  if (g != "selective") return;
  MOE_CHECK(c.recompute_method.empty(),
            "--recompute-method {} is not supported with --recompute-granularity selective (Megatron: selective "
            "recomputes its modules in every layer); drop --recompute-method",
            c.recompute_method);
  MOE_CHECK(c.recompute_num_layers == 0,
            "--recompute-num-layers {} with --recompute-granularity selective: it must be left unset (selective "
            "recomputes its modules in every layer)",
            c.recompute_num_layers);
  const std::vector<std::string> modules =
      c.recompute_modules.empty() ? std::vector<std::string>{"core_attn"} : c.recompute_modules;  // Megatron's default
  for (const std::string& m : modules) {
    MOE_CHECK(m != "gdn_norm_out" && m != "gdp_in_proj" && m != "gdp_qkv",
              "--recompute-modules {} needs gated delta-net attention (--experimental-attention-variant), which "
              "moecore does not have; use core_attn, moe_act, layernorm, mlp, moe or shared_experts",
              m);
    MOE_CHECK(m != "mhc",
              "--recompute-modules mhc needs hyper-connections (--enable-mhc-connections), which moecore does not "
              "have; use core_attn, moe_act, layernorm, mlp, moe or shared_experts");
  }
}
}  // namespace

void validate(const TrainConfig& c) {
  // Not derivable (H not divisible by the heads) says more than "--kv-channels 0 is out of range".
  MOE_CHECK(c.kv_channels != 0 || c.hidden_size <= 0 || c.num_attention_heads <= 0,
            "--hidden-size {} is not divisible by --num-attention-heads {}; set --kv-channels", c.hidden_size,
            c.num_attention_heads);
  for (const auto& f : flag_table()) check_accepted(c, f);
  // --device (docs/cuda.md): a GPU that cannot be used, or a setting GPU training does not cover, refused before any
  // work.
  if (c.device != "auto") training_device(c);
  // Health alarms (train/routing_health.h).
  MOE_CHECK(!c.check_for_spiky_loss || c.loss_spike_factor > 0,
            "--check-for-spiky-loss asks for the loss-spike check that --loss-spike-factor 0 turns off: drop one "
            "(moecore checks by default, with Megatron's factor 10 over the first 100 samples)");
  for (const auto& v : c.moe_aux_loss_coeff) {
    const double x = to_double("moe-aux-loss-coeff", v);
    MOE_CHECK(std::isfinite(x) && x >= 0, "--moe-aux-loss-coeff {} is out of range; accepted: finite numbers >= 0", v);
  }
  auto pos = [](int64_t v, const char* n) { MOE_CHECK(v > 0, "--{} must be positive, got {}", n, v); };
  // Logging flags (train/metrics.cpp).
  pos(c.num_layers, "num-layers");
  pos(c.hidden_size, "hidden-size");
  pos(c.num_attention_heads, "num-attention-heads");
  pos(c.seq_length, "seq-length");
  pos(c.micro_batch_size, "micro-batch-size");
  // Megatron: --no-position-embedding is deprecated and allowed only where it changes nothing (rope).
  MOE_CHECK(!c.no_position_embedding || c.position_embedding_type == "rope",
            "--no-position-embedding with --position-embedding-type {} is refused (as Megatron: the flag is "
            "deprecated); use --position-embedding-type none for no position embeddings",
            c.position_embedding_type);
  MOE_CHECK(!(c.swiglu && c.squared_relu), "--swiglu and --squared-relu are exclusive");
  MOE_CHECK(c.kv_channels != 0, "--hidden-size {} is not divisible by --num-attention-heads {}; set --kv-channels",
            c.hidden_size, c.num_attention_heads);
  MOE_CHECK(c.num_query_groups > 0 && c.num_attention_heads % c.num_query_groups == 0,
            "--num-attention-heads {} must be a multiple of --num-query-groups {}", c.num_attention_heads,
            c.num_query_groups);
  pos(c.ffn_hidden_size, "ffn-hidden-size");
  MOE_CHECK(c.max_position_embeddings >= c.seq_length, "--max-position-embeddings {} is below --seq-length {}",
            c.max_position_embeddings, c.seq_length);
  MOE_CHECK(c.rotary_percent > 0 && c.rotary_percent <= 1, "--rotary-percent must be in (0, 1]");
  MOE_CHECK(c.position_embedding_type != "rope" ||
                std::llround(static_cast<double>(c.kv_channels) * c.rotary_percent) / 2 * 2 >= 2,
            "--kv-channels {} x --rotary-percent {} rotates fewer than 2 dimensions of each head (RoPE rotates "
            "pairs); raise either",
            c.kv_channels, c.rotary_percent);
  // Multi-Latent Attention (Megatron's checks in arguments.py and core_transformer_config_from_args).
  MOE_CHECK(c.rope_type.empty() || c.rope_type == "rope" || c.rope_type == "yarn",
            "--rope-type {} is out of range; accepted: rope, yarn", c.rope_type);
  MOE_CHECK(c.multi_latent_attention || c.rope_type.empty() || c.rope_type == "rope",
            "--rope-type {}: common attention only supports --rope-type rope (as Megatron); yarn is for "
            "--multi-latent-attention",
            c.rope_type);
  // Multi-token prediction (Megatron's MTP validation in arguments.py).
  MOE_CHECK(c.mtp_num_layers == 0 || c.position_embedding_type == "rope" || c.position_embedding_type == "none",
            "--mtp-num-layers {} needs --position-embedding-type rope or none (as Megatron), not {}", c.mtp_num_layers,
            c.position_embedding_type);
  const TrainConfig defaults;
  const bool yarn_flags = c.yarn_beta_fast != defaults.yarn_beta_fast || c.yarn_beta_slow != defaults.yarn_beta_slow ||
                          c.yarn_original_max_position_embeddings != defaults.yarn_original_max_position_embeddings;
  MOE_CHECK(
      !yarn_flags || (c.multi_latent_attention && c.rope_type != "rope"),
      "--yarn-beta-fast, --yarn-beta-slow and --yarn-original-max-position-embeddings act on the YaRN of "
      "--multi-latent-attention here (moecore does not support --position-embedding-type yarn); without MLA's YaRN "
      "they would change nothing: drop them");
  if (c.multi_latent_attention) {
    MOE_CHECK(!c.group_query_attention,
              "--group-query-attention is mutually exclusive with --multi-latent-attention (as Megatron); drop it");
    const bool yarn = c.rope_type != "rope";
    const int64_t rot = yarn ? c.qk_pos_emb_head_dim
                             : static_cast<int64_t>(static_cast<double>(c.qk_pos_emb_head_dim) * c.rotary_percent);
    MOE_CHECK(rot >= 2 && rot % 2 == 0,
              "--qk-pos-emb-head-dim {}{} rotates {} channels; RoPE rotates pairs: use an even number, at least 2",
              c.qk_pos_emb_head_dim, yarn ? "" : fmt::format(" x --rotary-percent {}", c.rotary_percent), rot);
    MOE_CHECK(std::isfinite(c.mscale) && std::isfinite(c.mscale_all_dim),
              "--mscale and --mscale-all-dim must be finite");
    MOE_CHECK(c.rotary_scaling_factor <= 1 || 0.1 * c.mscale_all_dim * std::log(c.rotary_scaling_factor) + 1 != 0,
              "--mscale-all-dim {} with --rotary-scaling-factor {} makes YaRN's denominator 0", c.mscale_all_dim,
              c.rotary_scaling_factor);
  }
  padded_vocab_size(c, c.vocab_size);  // throws when padding overflows
  check_context_parallel(c);           // --context-parallel-size, --cp-comm-type, --hierarchical-context-parallel-sizes
  check_pipeline_flags(c);
  const int64_t tp = c.tensor_model_parallel_size, etp = c.expert_tensor_parallel_size;
  MOE_CHECK(tp >= 1 && etp >= 1, "--tensor-model-parallel-size and --expert-tensor-parallel-size must be >= 1");
  if (tp > 1) {
    MOE_CHECK(c.sequence_parallel,
              "--tensor-model-parallel-size {} needs --sequence-parallel: moecore runs tensor parallelism with "
              "sequence parallelism only (Megatron requires it for MoE; add the flag)",
              tp);
    MOE_CHECK(c.disable_bias_linear,
              "--tensor-model-parallel-size {} with linear biases is not available; pass --disable-bias-linear", tp);
    MOE_CHECK(c.num_attention_heads % tp == 0 && c.num_query_groups % tp == 0,
              "--num-attention-heads {} and --num-query-groups {} must be divisible by --tensor-model-parallel-size {}",
              c.num_attention_heads, c.num_query_groups, tp);
    MOE_CHECK(c.seq_length % tp == 0,
              "--seq-length {} must be divisible by --tensor-model-parallel-size {} "
              "(sequence parallelism splits it)",
              c.seq_length, tp);
    MOE_CHECK(c.ffn_hidden_size % tp == 0, "--ffn-hidden-size {} must be divisible by --tensor-model-parallel-size {}",
              c.ffn_hidden_size, tp);
    MOE_CHECK(c.moe_shared_expert_intermediate_size % tp == 0,
              "--moe-shared-expert-intermediate-size {} must be divisible by --tensor-model-parallel-size {}",
              c.moe_shared_expert_intermediate_size, tp);
  }
  MOE_CHECK(c.save_interval >= 0 && c.exit_interval >= 0, "--save-interval and --exit-interval must be >= 0");
  MOE_CHECK(StopSignals::parse(c.exit_signal) != 0,
            "--exit-signal {} is not a signal a handler can catch and return from; one of: {}", c.exit_signal,
            StopSignals::kExitSignalChoices);
  // --save-interval without --save saves nothing, as in Megatron (training.py saves when both are set).
  for (auto [on, name] : {std::pair{c.finetune, "finetune"},
                          {c.no_load_optim, "no-load-optim"},
                          {c.no_load_rng, "no-load-rng"},
                          {c.moe_use_upcycling, "moe-use-upcycling"}})
    MOE_CHECK(!on || !c.load.empty(), "--{} needs --load (the checkpoint it applies to)", name);
  MOE_CHECK(c.ckpt_step < 0 || !c.load.empty(), "--ckpt-step {} needs --load (the directory holding iter_NNNNNNN)",
            c.ckpt_step);
  MOE_CHECK(c.moe_upcycling_granularity >= 1, "--moe-upcycling-granularity must be >= 1");
  MOE_CHECK(c.moe_upcycling_granularity == 1 || c.moe_use_upcycling,
            "--moe-upcycling-granularity {} without --moe-use-upcycling", c.moe_upcycling_granularity);
  if (c.moe_use_upcycling) {
    MOE_CHECK(c.num_experts > 0, "--moe-use-upcycling needs --num-experts (the MoE model to make)");
    MOE_CHECK(!c.save.empty(), "--moe-use-upcycling needs --save (where the upcycled checkpoint goes)");
    MOE_CHECK(c.load_hf.empty(), "--moe-use-upcycling upcycles a native dense checkpoint (--load), not --load-hf");
  }
  if (!c.fault_kill_during_save.empty()) {
    const auto colon = c.fault_kill_during_save.find(':');
    MOE_CHECK(colon != std::string::npos, "--fault-kill-during-save expects RANK:ITERATION, got '{}'",
              c.fault_kill_during_save);
    to_int("fault-kill-during-save", c.fault_kill_during_save.substr(0, colon));
    to_int("fault-kill-during-save", c.fault_kill_during_save.substr(colon + 1));
  }
  // run control (runcontrol): Megatron's checks on --save-retain-interval, the testing stall's form.
  if (c.save_retain_interval > 0 && c.save_interval > 0)
    MOE_CHECK(c.save_retain_interval % c.save_interval == 0,
              "--save-retain-interval {} must be a multiple of --save-interval {} (as Megatron requires)",
              c.save_retain_interval, c.save_interval);
  if (!c.testing_stall.empty()) {
    const auto a = c.testing_stall.find(':'), b = c.testing_stall.rfind(':');
    MOE_CHECK(a != std::string::npos && b != a, "--testing-stall expects RANK:ITERATION:SECONDS, got '{}'",
              c.testing_stall);
    to_int("testing-stall", c.testing_stall.substr(0, a));
    to_int("testing-stall", c.testing_stall.substr(a + 1, b - a - 1));
    to_int("testing-stall", c.testing_stall.substr(b + 1));
  }
  // Megatron's precision-aware optimizer checks (OptimizerConfig, get_megatron_optimizer).
  for (const auto& [flag, dtype] :
       {std::pair<const char*, const std::string&>{"exp-avg-dtype", c.exp_avg_dtype},
        std::pair<const char*, const std::string&>{"exp-avg-sq-dtype", c.exp_avg_sq_dtype}}) {
    MOE_CHECK(dtype == "fp32" || c.use_precision_aware_optimizer,
              "--{} {}: {} can only be fp32 when not using precision-aware optimizer (as Megatron): add "
              "--use-precision-aware-optimizer",
              flag, dtype, flag);
    MOE_CHECK(dtype == "fp32" || dtype == "bf16",
              "--{} {}: Adam moments in {} (scaled states) are not supported by moecore; use bf16 or fp32", flag, dtype,
              dtype);
  }
  if (c.use_precision_aware_optimizer) {
    MOE_CHECK(c.optimizer == "adam",
              "--use-precision-aware-optimizer only supported with adam (as Megatron), not "
              "--optimizer {}",
              c.optimizer);
    MOE_CHECK(c.use_distributed_optimizer,
              "--use-precision-aware-optimizer only supported with distributed optimizer (as Megatron): add "
              "--use-distributed-optimizer");
  }
  if (c.optimizer == "muon" || c.optimizer == "dist_muon") {  // Megatron checks these as it builds the optimizer
    optim::check_newton_schulz(c.muon_coefficient_type, c.muon_num_ns_steps);
    MOE_CHECK(c.num_distributed_optimizer_instances == 1 || (c.optimizer == "muon" && !c.use_distributed_optimizer),
              "--num-distributed-optimizer-instances {} with {}: Megatron's layer-wise distributed optimizer (Muon's) "
              "has one instance; use --num-distributed-optimizer-instances 1 or --optimizer muon without "
              "--use-distributed-optimizer",
              c.num_distributed_optimizer_instances,
              c.optimizer == "dist_muon" ? "--optimizer dist_muon" : "--optimizer muon --use-distributed-optimizer");
  }
  MOE_CHECK(c.global_batch_size % c.micro_batch_size == 0,
            "--global-batch-size {} must be a multiple of --micro-batch-size {} x data-parallel size 1",
            c.global_batch_size, c.micro_batch_size);
  validate_schedule_flags(c);
  validate_recompute(c);
  MOE_CHECK(c.skip_train || c.train_iters > 0, "--train-iters must be positive (or pass --skip-train)");
  pos(c.log_interval, "log-interval");
  pos(c.eval_interval, "eval-interval");
  MOE_CHECK(c.eval_iters >= 0, "--eval-iters must be >= 0");
  MOE_CHECK(c.weight_decay >= 0 && c.clip_grad >= 0, "--weight-decay and --clip-grad must be >= 0");
  MOE_CHECK(c.generate_temperature > 0 && c.generate_top_k >= 0 && c.generate_tokens >= 0,
            "--generate-temperature must be positive and --generate-top-k, --generate-tokens >= 0");
  MOE_CHECK(c.mock_data != !c.data_path.empty(), "give exactly one of --data-path and --mock-data");
  if (c.tokenizer_type == "HuggingFaceTokenizer")
    MOE_CHECK(!c.tokenizer_model.empty(), "--tokenizer-type HuggingFaceTokenizer needs --tokenizer-model");
  if (c.tokenizer_type == "GPT2BPETokenizer")
    MOE_CHECK(!c.vocab_file.empty() && !c.merge_file.empty(),
              "--tokenizer-type GPT2BPETokenizer needs --vocab-file (vocab.json) and --merge-file (merges.txt)");
  if (c.tokenizer_type == "NullTokenizer" || c.tokenizer_type.empty())
    MOE_CHECK(c.vocab_size > 0, "--vocab-size is required with {} (or use --tokenizer-type HuggingFaceTokenizer)",
              c.tokenizer_type.empty() ? "no --tokenizer-type" : "NullTokenizer");
  MOE_CHECK(c.tokenizer_type != "" || c.mock_data, "--data-path needs a --tokenizer-type");
  validate(lr_schedule(c));
  if (c.num_experts > 0) {
    // Expert biases as Megatron has them: with ETP 1 only (TransformerConfig), and not through upcycling, whose
    // grouped-GEMM path would leave the dense FFN's biases behind.
    MOE_CHECK(c.disable_bias_linear || etp == 1,
              "--expert-tensor-parallel-size {} with linear biases: expert biases need expert tensor parallelism 1 "
              "(as in Megatron); pass --disable-bias-linear or --expert-tensor-parallel-size 1",
              etp);
    MOE_CHECK(c.disable_bias_linear || !c.moe_use_upcycling,
              "--moe-use-upcycling with linear biases is not available: the dense FFN's biases have no place in the "
              "upcycled experts; pass --disable-bias-linear");
    MOE_CHECK(c.moe_grouped_gemm, "moe-grouped-gemm: false is rejected: moecore always runs experts as grouped GEMMs");
    MOE_CHECK(c.moe_token_dispatcher_type == "alltoall" || c.moe_token_dispatcher_type == "allgather",
              "--moe-token-dispatcher-type {} is rejected; use alltoall or allgather", c.moe_token_dispatcher_type);
    // Megatron's checks of --moe-shared-expert-overlap (TransformerConfig): with shared experts, the alltoall
    // dispatcher, and no shared_experts recompute.
    if (c.moe_shared_expert_overlap && c.moe_shared_expert_intermediate_size > 0) {
      MOE_CHECK(c.moe_token_dispatcher_type == "alltoall",
                "--moe-shared-expert-overlap only works with the alltoall token dispatcher (Megatron's rule); drop "
                "--moe-token-dispatcher-type {} or the overlap",
                c.moe_token_dispatcher_type);
      for (const std::string& m : c.recompute_modules)
        MOE_CHECK(m != "shared_experts",
                  "--recompute-modules shared_experts cannot work with --moe-shared-expert-overlap (Megatron's rule)");
    }
    MOE_CHECK(c.expert_model_parallel_size >= 1 && c.num_experts % c.expert_model_parallel_size == 0,
              "--num-experts {} is not divisible by --expert-model-parallel-size {}", c.num_experts,
              c.expert_model_parallel_size);
    MOE_CHECK(c.moe_ffn_hidden_size % etp == 0,
              "--moe-ffn-hidden-size {} must be divisible by --expert-tensor-parallel-size {}", c.moe_ffn_hidden_size,
              etp);
    moe::validate(moe_layer_config(c));
    if (c.moe_use_upcycling) {  // reference §1.14: g = F_dense / F_moe, experts E = r·g
      const int64_t g = c.moe_upcycling_granularity;
      MOE_CHECK(c.moe_ffn_hidden_size * g == c.ffn_hidden_size,
                "--moe-upcycling-granularity {} cuts the dense FFN of --ffn-hidden-size {} into experts of {}: set "
                "--moe-ffn-hidden-size {}",
                g, c.ffn_hidden_size, c.ffn_hidden_size / g, c.ffn_hidden_size / g);
      MOE_CHECK(c.ffn_hidden_size % g == 0 && c.num_experts % g == 0,
                "--moe-upcycling-granularity {} must divide --ffn-hidden-size {} and --num-experts {}", g,
                c.ffn_hidden_size, c.num_experts);
      MOE_CHECK(c.moe_shared_expert_intermediate_size == 0,
                "--moe-use-upcycling with shared experts is not supported: the dense FFN becomes the routed experts");
    }
  } else {
    MOE_CHECK(c.expert_model_parallel_size == 1, "--expert-model-parallel-size {} needs --num-experts",
              c.expert_model_parallel_size);
    MOE_CHECK(c.moe_shared_expert_intermediate_size == 0 && c.moe_ffn_hidden_size == 0,
              "--moe-* sizes are set but --num-experts is 0");
  }
}

void resolve(TrainConfig& c) {
  resolve_defaults(c);
  // Megatron's standard attention never reads --recompute-modules mla_up_proj: listed with the flags that have no
  // effect.
  const auto& rm = c.recompute_modules;
  if (c.recompute_granularity == "selective" && !c.multi_latent_attention &&
      std::find(rm.begin(), rm.end(), "mla_up_proj") != rm.end())
    note_no_effect(c, kUpProjNoEffect);
  // Megatron's checkpoint formats select moecore's own here.
  if (c.ckpt_format != "moecore")
    note_no_effect(c, fmt::format("--ckpt-format {}: {}. {}", c.ckpt_format, ckpt::kOwnCheckpointFormat,
                                  ckpt::kMegatronCheckpointWayIn));
  validate(c);
  // --moe-layer-freq, once for every user (validated --num-layers: the list has one entry per layer).
  c.is_moe_layer.assign(static_cast<size_t>(c.num_layers), false);
  if (c.num_experts > 0) c.is_moe_layer = moe::parse_moe_layer_freq(c.moe_layer_freq, c.num_layers);
  c.resolved_fingerprint = fingerprint(c);
}

bool is_resolved(const TrainConfig& c) {
  return c.resolved_fingerprint != 0 && c.resolved_fingerprint == fingerprint(c);
}

}  // namespace moecore::train
