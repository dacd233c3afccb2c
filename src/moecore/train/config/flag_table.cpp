// The flag table (see config.h): every moecore train flag with its field, default, help, roles, accepted values and
// group, in --help order; TrainConfig's defaults from it; and the lookups over it. The values' conversions and the
// module configs: config.cpp.
#include <fmt/format.h>

#include "moecore/core/error.h"
#include "moecore/train/config/config.h"
#include "moecore/train/config/megatron_flags.h"
#include "moecore/train/config/presets.h"

namespace moecore::train {

std::vector<FlagSpec> fsdp_flag_rows();        // Megatron FSDP's rows (flag_table_fsdp.cpp)
std::vector<FlagSpec> dispatcher_flag_rows();  // the token dispatcher's rows (flag_table_dispatcher.cpp)
std::vector<FlagSpec> main_grad_flag_rows();   // the main gradients' dtype (flag_table_grads.cpp)

namespace {

// --ckpt-format: moecore's own, and Megatron's choices as selectors without effect (config_resolve.cpp lists them).
std::vector<std::string> ckpt_formats() {
  std::vector<std::string> formats{"moecore"};
  const MegatronFlag* f = find_megatron_flag("ckpt-format");
  MOE_ASSERT(f != nullptr);
  formats.insert(formats.end(), f->choices.begin(), f->choices.end());
  return formats;
}

std::vector<FlagSpec> build_flag_table() {
  using C = TrainConfig;
  std::vector<FlagSpec> t;
  auto section = [&](FlagGroup g, std::vector<FlagSpec> flags) {
    for (auto& f : flags) {
      f.group = g;
      t.push_back(std::move(f));
    }
  };
  std::string presets;
  for (const auto& p : preset_names()) presets += (presets.empty() ? "" : ", ") + p;
  section(
      FlagGroup::Model,
      {{"model", &C::model, "", "Preset: " + presets + " (flags override)"},
       {"num-layers", &C::num_layers, 2, "Transformer layers", kModel, above_to(0, 2147483647)},
       {"hidden-size", &C::hidden_size, 256, "Hidden size H", kModel, positive()},
       {"ffn-hidden-size", &C::ffn_hidden_size, 0, "Dense FFN size (default 4H; 8H/3 rounded to 64 with --swiglu)",
        kModel | kDerived, positive()},
       {"num-attention-heads", &C::num_attention_heads, 4, "Query heads", kModel, positive()},
       {"group-query-attention", &C::group_query_attention, false, "Use --num-query-groups key/value heads",
        kCheckpointArg},
       {"num-query-groups", &C::num_query_groups, 1, "Key/value heads with --group-query-attention", kModel | kDerived,
        positive()},
       {"kv-channels", &C::kv_channels, 0, "Head dimension (default H / heads)", kModel | kDerived, positive()},
       {"qk-layernorm", &C::qk_layernorm, false, "--normalization on each query and key head (Qwen3, OLMoE)", kModel},
       {"seq-length", &C::seq_length, 256, "Sequence length", kNoRole, positive()},
       {"max-position-embeddings", &C::max_position_embeddings, 0, "Longest position (default --seq-length)",
        kCheckpointArg | kDerived, positive()},
       {"rotary-base", &C::rotary_base, 10000, "RoPE base", kModel, positive()},
       {"rotary-percent", &C::rotary_percent, 1.0, "Fraction of each head rotated", kModel, above_to(0, 1)},
       {"position-embedding-type", &C::position_embedding_type, "learned_absolute",
        "learned_absolute (Megatron's default: a learned table added to the word embeddings), rope or none", kModel,
        one_of({"learned_absolute", "rope", "none"})},
       {"no-position-embedding", &C::no_position_embedding, false,
        "Deprecated in Megatron: only with --position-embedding-type rope (where it changes nothing)", kModel},
       {"normalization", &C::normalization, "LayerNorm", "LayerNorm (Megatron's default) or RMSNorm", kModel,
        one_of({"LayerNorm", "RMSNorm"})},
       {"apply-layernorm-1p", &C::apply_layernorm_1p, false,
        "Zero-centred norm weights: the scale is 1 + weight (init 0)", kModel},
       {"norm-epsilon", &C::norm_epsilon, 1e-5, "Norm epsilon", kModel, at_least(0)},
       {"untie-embeddings-and-output-weights", &C::untie_embeddings_and_output_weights, false, "Separate output layer",
        kModel},
       {"swiglu", &C::swiglu, false, "SwiGLU FFNs (default GeLU)", kModel},
       {"squared-relu", &C::squared_relu, false, "Squared-ReLU FFNs", kModel},
       {"disable-bias-linear", &C::disable_bias_linear, false,
        "No biases in linear layers (the MoE router and experts included)", kModel},
       {"init-method-std", &C::init_method_std, 0.02, "Std of the normal weight init", kNoRole, at_least(0)},
       {"make-vocab-size-divisible-by", &C::make_vocab_size_divisible_by, 128, "Pad the vocabulary to a multiple",
        kNoRole, positive()},
       {"padded-vocab-size", &C::padded_vocab_size, 0,
        "Rows of the embedding and output layer, as given (no padding; at least the tokenizer's vocabulary, "
        "divisible by TP; 0: pad by --make-vocab-size-divisible-by)",
        kCheckpointArg, at_least(0)},
       {"hidden-dropout", &C::hidden_dropout, 0.1,
        "Dropout probability on the embedding output and each block's output before its residual add (training)",
        kNoRole, between(0, 1, true)},
       {"attention-dropout", &C::attention_dropout, 0.1,
        "Dropout probability on the attention probabilities (training)", kNoRole, between(0, 1, true)},
       {"mtp-num-layers", &C::mtp_num_layers, 0,
        "Multi-token prediction depths D after the main model, on the last pipeline stage (0: none)", kModel,
        at_least(0)},
       {"mtp-loss-scaling-factor", &C::mtp_loss_scaling_factor, 0.1,
        "MTP loss weight: factor/D times the sum of the depths' mean losses joins the training objective", kNoRole,
        at_least(0)},
       {"multi-latent-attention", &C::multi_latent_attention, false,
        "Multi-Latent Attention (DeepSeek-V3): low-rank q and compressed kv with decoupled RoPE", kModel},
       {"q-lora-rank", &C::q_lora_rank, 0, "MLA query latent rank (unset or 0: a direct q projection)", kModel,
        at_least(0)},
       {"kv-lora-rank", &C::kv_lora_rank, 32, "MLA compressed key-value rank", kModel, positive()},
       {"qk-head-dim", &C::qk_head_dim, 128, "MLA query/key channels per head without RoPE", kModel, positive()},
       {"qk-pos-emb-head-dim", &C::qk_pos_emb_head_dim, 64, "MLA query/key RoPE channels per head", kModel, positive()},
       {"v-head-dim", &C::v_head_dim, 128, "MLA value channels per head", kModel, positive()},
       {"rope-type", &C::rope_type, "",
        "MLA's RoPE: rope or yarn (unset: yarn with MLA; plain attention takes rope only)", kModel},
       {"rotary-scaling-factor", &C::rotary_scaling_factor, 1.0,
        "MLA YaRN scaling factor s (also in the softmax scale)", kModel, positive()},
       {"mscale", &C::mscale, 1.0, "MLA YaRN mscale (the cos/sin factor's numerator)", kModel},
       {"mscale-all-dim", &C::mscale_all_dim, 0.0,
        "MLA YaRN mscale_all_dim (cos/sin factor's denominator, softmax scale)", kModel},
       {"yarn-beta-fast", &C::yarn_beta_fast, 32, "MLA YaRN beta_fast: rotations where the ramp starts", kModel,
        positive()},
       {"yarn-beta-slow", &C::yarn_beta_slow, 1, "MLA YaRN beta_slow: rotations where the ramp ends", kModel,
        positive()},
       {"yarn-original-max-position-embeddings", &C::yarn_original_max_position_embeddings, 4096,
        "MLA YaRN original context length (the one the model was pretrained at)", kModel, positive()}});
  section(
      FlagGroup::MoE,
      {{"num-experts", &C::num_experts, 0, "Routed experts per MoE layer (0: dense)", kModel, at_least(0)},
       {"moe-ffn-hidden-size", &C::moe_ffn_hidden_size, 0, "Expert FFN size (default --ffn-hidden-size)",
        kModel | kDerived, at_least(0)},
       {"moe-router-topk", &C::moe_router_topk, 2, "Experts per token", kModel, positive()},
       {"moe-router-score-function", &C::moe_router_score_function, "softmax", "softmax or sigmoid", kModel,
        one_of({"softmax", "sigmoid"})},
       {"moe-router-pre-softmax", &C::moe_router_pre_softmax, false, "Softmax over all experts before top-k", kModel},
       {"moe-router-topk-scaling-factor", &C::moe_router_topk_scaling_factor, 0, "Scale routing probs", kModel,
        at_least(0)},
       {"moe-router-num-groups", &C::moe_router_num_groups, 0, "Expert groups for group-limited routing", kModel,
        at_least(0)},
       {"moe-router-group-topk", &C::moe_router_group_topk, 0, "Groups each token may use", kModel, at_least(0)},
       {"moe-router-enable-expert-bias", &C::moe_router_enable_expert_bias, false, "Aux-loss-free balancing", kModel},
       {"moe-router-bias-update-rate", &C::moe_router_bias_update_rate, 1e-3, "Expert-bias step per batch", kNoRole,
        at_least(0)},
       {"moe-router-load-balancing-type",
        &C::moe_router_load_balancing_type,
        {"aux_loss"},
        "aux_loss, seq_aux_loss, global_aux_loss, sinkhorn, none (a list)",
        kNoRole,
        one_of({"aux_loss", "seq_aux_loss", "global_aux_loss", "sinkhorn", "none"})},
       {"moe-aux-loss-coeff", &C::moe_aux_loss_coeff, {"0.0"}, "One coefficient per load-balancing type"},
       {"moe-z-loss-coeff", &C::moe_z_loss_coeff, 0, "Router z-loss coefficient", kNoRole, at_least(0)},
       {"moe-input-jitter-eps", &C::moe_input_jitter_eps, 0, "Multiplicative router input jitter", kNoRole,
        between(0, 1, true)},
       {"moe-router-force-load-balancing", &C::moe_router_force_load_balancing, false, "Route on noise (bench)"},
       {"moe-router-dtype", &C::moe_router_dtype, "fp32", "fp32 or fp64", kNoRole, one_of({"fp32", "fp64"})},
       {"moe-expert-capacity-factor", &C::moe_expert_capacity_factor, -1, "Capacity factor (<0: dropless)"},
       {"moe-token-drop-policy", &C::moe_token_drop_policy, "probs", "probs or position", kNoRole,
        one_of({"probs", "position"})},
       {"moe-pad-expert-input-to-capacity", &C::moe_pad_expert_input_to_capacity, false, "Pad to capacity"},
       {"moe-shared-expert-intermediate-size", &C::moe_shared_expert_intermediate_size, 0, "Shared expert size", kModel,
        at_least(0)},
       {"moe-shared-expert-gate", &C::moe_shared_expert_gate, false, "Sigmoid gate on the shared expert", kModel},
       {"moe-shared-expert-overlap", &C::moe_shared_expert_overlap, false,
        "GPU: shared experts on a second stream beside the routed experts (the same math)"},
       {"moe-layer-freq", &C::moe_layer_freq, "1", "N or a list such as ([0]*1+[1]*3)", kModel | kListExpression},
       {"moe-grouped-gemm", &C::moe_grouped_gemm, true, "Grouped GEMM experts (always on in moecore)"},
       {"moe-per-layer-logging", &C::moe_per_layer_logging, false, "Log each MoE layer's losses and load"}});
  section(FlagGroup::MoE, dispatcher_flag_rows());
  section(
      FlagGroup::Training,
      {{"micro-batch-size", &C::micro_batch_size, 4, "Sequences per micro-batch", kNoRole, positive()},
       {"global-batch-size", &C::global_batch_size, 0, "Sequences per step (default micro x DP)", kDerived, positive()},
       {"train-iters", &C::train_iters, 0, "Optimizer steps (with --train-samples: train-samples / global batch)",
        kDerived, at_least(0)},
       {"lr", &C::lr, 1e-4, "Peak learning rate", kSchedule, at_least(0)},
       {"min-lr", &C::min_lr, 0, "Final learning rate", kSchedule, at_least(0)},
       {"lr-decay-style", &C::lr_decay_style, "linear", "constant, linear, cosine, inverse-square-root or WSD",
        kSchedule, one_of({"constant", "linear", "cosine", "inverse-square-root", "WSD"})},
       {"lr-wsd-decay-style", &C::lr_wsd_decay_style, "exponential",
        "WSD anneal: linear, cosine, exponential, minus_sqrt", kSchedule,
        one_of({"linear", "cosine", "exponential", "minus_sqrt"})},
       {"lr-warmup-iters", &C::lr_warmup_iters, 0, "Linear warmup steps", kSchedule, at_least(0)},
       {"lr-decay-iters", &C::lr_decay_iters, 0, "Decay steps (default --train-iters)", kSchedule | kDerived,
        at_least(0)},
       {"lr-wsd-decay-iters", &C::lr_wsd_decay_iters, 0, "WSD anneal steps", kSchedule, at_least(0)},
       {"weight-decay", &C::weight_decay, 0.01, "AdamW weight decay (not on norms and biases)", kNoRole, at_least(0)},
       {"clip-grad", &C::clip_grad, 1.0, "Global gradient-norm clip (0: off)", kNoRole, at_least(0)},
       {"adam-beta1", &C::adam_beta1, 0.9, "Adam beta1", kNoRole, between(0, 1, true)},
       {"adam-beta2", &C::adam_beta2, 0.999, "Adam beta2", kNoRole, between(0, 1, true)},
       {"adam-eps", &C::adam_eps, 1e-8, "Adam epsilon", kNoRole, at_least(0)},
       {"optimizer", &C::optimizer, "adam",
        "adam (AdamW), sgd, muon (Muon + AdamW), dist_muon (muon, layer-wise sharded)", kNoRole,
        one_of({"adam", "sgd", "muon", "dist_muon"})},
       {"decoupled-lr", &C::decoupled_lr, -1, "Peak LR of the input embedding and output layer (-1: --lr)", kNoRole,
        at_least(-1)},
       {"decoupled-min-lr", &C::decoupled_min_lr, -1, "Final LR of the embedding and output layer (-1: --min-lr)",
        kNoRole, at_least(-1)},
       {"sgd-momentum", &C::sgd_momentum, 0.9, "SGD momentum", kNoRole, at_least(0)},
       {"muon-momentum", &C::muon_momentum, 0.9, "Muon momentum (EMA)"},
       {"muon-nesterov", &C::muon_nesterov, false, "Nesterov momentum in Muon"},
       {"muon-no-split-qkv", &C::muon_no_split_qkv, false, "Orthogonalise q, k, v of a layer as one matrix"},
       {"muon-scale-mode", &C::muon_scale_mode, "spectral", "Muon update scale", kNoRole,
        one_of({"spectral", "unit_rms_norm", "shape_scaling"})},
       {"muon-extra-scale-factor", &C::muon_extra_scale_factor, 1.0, "Extra factor on the Muon update"},
       {"muon-fp32-matmul-prec", &C::muon_fp32_matmul_prec, "medium",
        "Newton-Schulz products: medium = bf16, high/low = fp32", kNoRole, one_of({"low", "medium", "high"})},
       {"muon-coefficient-type", &C::muon_coefficient_type, "quintic", "Newton-Schulz coefficients", kNoRole,
        one_of({"simple", "quintic", "polar_express", "aol"})},
       {"muon-num-ns-steps", &C::muon_num_ns_steps, 5, "Newton-Schulz iterations", kNoRole, positive()},
       {"muon-tp-mode", &C::muon_tp_mode, "duplicated",
        "TP shards: whole matrix (duplicated, distributed) or per shard (blockwise)", kNoRole,
        one_of({"blockwise", "duplicated", "distributed"})},
       {"muon-scalar-optimizer", &C::muon_scalar_optimizer, "adam",
        "Optimizer beside Muon: adam (Megatron's lion is refused)", kNoRole, one_of({"adam"})},
       {"train-samples", &C::train_samples, 0, "Train on this many samples instead of --train-iters (0: unset)",
        kNoRole, at_least(0)},
       {"lr-decay-samples", &C::lr_decay_samples, 0, "Decay samples with --train-samples (default --train-samples)",
        kDerived, at_least(0)},
       {"lr-warmup-samples", &C::lr_warmup_samples, 0, "Linear warmup samples with --train-samples", kNoRole,
        at_least(0)},
       {"lr-wsd-decay-samples", &C::lr_wsd_decay_samples, 0, "WSD anneal samples with --train-samples", kNoRole,
        at_least(0)},
       {"lr-warmup-fraction", &C::lr_warmup_fraction, -1, "Warmup as a fraction of the decay steps (-1: unset)",
        kNoRole},
       {"lr-warmup-init", &C::lr_warmup_init, 0, "Learning rate the warmup starts from", kNoRole, at_least(0)},
       {"start-weight-decay", &C::start_weight_decay, -1,
        "Weight decay at the start with --weight-decay-incr-style linear/cosine (-1: unset)", kNoRole},
       {"end-weight-decay", &C::end_weight_decay, -1,
        "Weight decay at the end with --weight-decay-incr-style linear/cosine (-1: unset)", kNoRole},
       {"weight-decay-incr-style", &C::weight_decay_incr_style, "constant",
        "constant (--weight-decay), or linear/cosine from --start- to --end-weight-decay over training", kNoRole,
        one_of({"constant", "linear", "cosine"})},
       {"use-checkpoint-opt_param-scheduler", &C::use_checkpoint_opt_param_scheduler, false,
        "On resume take the schedule (lr, min-lr, warmup, decay, weight decay) from the checkpoint, not the flags"},
       {"override-opt_param-scheduler", &C::override_opt_param_scheduler, false,
        "On resume take the schedule from the flags, ignoring the checkpoint's"},
       {"calculate-per-token-loss", &C::calculate_per_token_loss, false,
        "Normalize loss and gradients by the loss tokens of the whole global batch (not per micro-batch)"},
       {"eod-mask-loss", &C::eod_mask_loss, false, "No loss on end-of-document tokens"},
       {"seed", &C::seed, 1234, "Random seed"},
       {"bf16", &C::bf16, false, "bf16 GEMMs with fp32 master weights and accumulation"},
       {"fp16", &C::fp16, false,
        "fp16 GEMMs with fp32 master weights, loss scaling, and fp16 main gradients (fp32 with "
        "--accumulate-allreduce-grads-in-fp32)"},
       {"loss-scale", &C::loss_scale, 0, "Constant loss scale with --fp16 or --bf16 (0: none, or dynamic under --fp16)",
        kNoRole, at_least(0)},
       {"initial-loss-scale", &C::initial_loss_scale, 4294967296.0, "Dynamic loss scale: the first scale", kNoRole,
        positive()},
       {"min-loss-scale", &C::min_loss_scale, 1.0, "Dynamic loss scale: its floor", kNoRole, positive()},
       {"loss-scale-window", &C::loss_scale_window, 1000, "Dynamic loss scale: clean steps before it doubles", kNoRole,
        positive()},
       {"hysteresis", &C::hysteresis, 2, "Dynamic loss scale: non-finite steps before it halves", kNoRole, positive()},
       {"fp8-format", &C::fp8_format, "",
        "FP8 GEMMs in the transformer layers' linears and experts (emulated exactly on the CPU): e4m3 everywhere, or "
        "hybrid (e4m3 forward, e5m2 gradients); unset: off",
        kNoRole, one_of({"", "e4m3", "hybrid"})},
       {"fp8-recipe", &C::fp8_recipe, "delayed",
        "FP8 scaling: delayed (amax history), tensorwise (current amax), blockwise (1x128 tiles, 128x128 weight "
        "blocks); mxfp8 and custom: refused",
        kNoRole, one_of({"tensorwise", "delayed", "mxfp8", "blockwise", "custom"})},
       {"fp8-margin", &C::fp8_margin, 0, "Delayed scaling: scale = (fp8 max / amax) / 2^margin", kNoRole, at_least(0)},
       {"fp8-amax-history-len", &C::fp8_amax_history_len, 1, "Delayed scaling: amaxes kept per operand", kNoRole,
        positive()},
       {"fp8-amax-compute-algo", &C::fp8_amax_compute_algo, "most_recent",
        "Delayed scaling: the amax a scale is taken from: most_recent or max (of the history)", kNoRole,
        one_of({"most_recent", "max"})},
       {"first-last-layers-bf16", &C::first_last_layers_bf16, false,
        "FP8: keep the first --num-layers-at-start-in-bf16 and last --num-layers-at-end-in-bf16 layers in bf16"},
       {"num-layers-at-start-in-bf16", &C::num_layers_at_start_in_bf16, 1,
        "With --first-last-layers-bf16: leading layers kept in bf16", kNoRole, at_least(0)},
       {"num-layers-at-end-in-bf16", &C::num_layers_at_end_in_bf16, 1,
        "With --first-last-layers-bf16: trailing layers kept in bf16", kNoRole, at_least(0)},
       {"testing-memory-limit", &C::testing_memory_limit, 0,
        "Testing: bytes this rank may use, instead of the cgroup or MemAvailable limit (0: detect)", kNoRole,
        at_least(0)},
       {"device", &C::device, "auto",
        "auto, cpu or cuda. auto: the GPU when one is visible (never the CPU then: a setting the GPU does not cover is "
        "refused with the reason, as under cuda), else the CPU (docs/cuda.md)",
        kNoRole, one_of({"auto", "cpu", "cuda"})},
       // activation recompute: bitwise the same losses and gradients, less activation memory, more compute
       {"recompute-granularity", &C::recompute_granularity, "",
        "full (whole layers keep only their input) or selective (the --recompute-modules); none by default", kNoRole,
        one_of({"", "full", "selective"})},
       {"recompute-method", &C::recompute_method, "",
        "With full: uniform (chunks of --recompute-num-layers layers) or block (the first --recompute-num-layers "
        "layers)",
        kNoRole, one_of({"", "uniform", "block"})},
       {"recompute-num-layers", &C::recompute_num_layers, 0,
        "With full: layers per recompute chunk (uniform) or layers recomputed (block)", kNoRole, at_least(0)},
       {"recompute-modules",
        &C::recompute_modules,
        {},
        "With selective (default core_attn): core_attn, moe_act, layernorm, mlp (dense layers), moe, shared_experts",
        kNoRole,
        one_of({"core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts", "gdn_norm_out",
                "gdp_in_proj", "gdp_qkv", "mhc"})},
       {"recompute-activations", &C::recompute_activations, false, "Same as --recompute-granularity selective"},
       {"moe-layer-recompute", &C::moe_layer_recompute, false,
        "Deprecated in Megatron: --recompute-granularity selective with moe added to --recompute-modules"},
       // activation offloading: bitwise the same losses and gradients, less GPU memory, host copies beside compute
       {"fine-grained-activation-offloading", &C::fine_grained_activation_offloading, false,
        "GPU: the --offload-modules' stashes copied to pinned host memory after forward and back before backward "
        "(the CPU keeps activations in host memory already: no effect there)"},
       {"offload-modules",
        &C::offload_modules,
        {},
        "With --fine-grained-activation-offloading: attn_norm, qkv_linear, core_attn, attn_proj (with core_attn), "
        "mlp_norm, expert_fc1, moe_act, fused_group_mlp",
        kNoRole,
        one_of({"attn_norm", "qkv_linear", "core_attn", "attn_proj", "mlp_norm", "expert_fc1", "moe_act",
                "fused_group_mlp", "gdp_qkv"})},
       {"min-offloaded-tensor-size", &C::min_offloaded_tensor_size, 1024 * 1024,
        "Offloading: stash tensors of fewer elements stay on the device", kNoRole, at_least(0)},
       {"fine-grained-offloading-max-inflight-offloads", &C::fine_grained_offloading_max_inflight_offloads, -1,
        "Offloading: layers whose copies to the host may run before compute waits for them (-1: Megatron's None, "
        "one layer)",
        kNoRole, at_least(-1)},
       {"testing-offload-on-cpu", &C::testing_offload_on_cpu, false,
        "Testing: on the CPU, offloading copies the stashes to a separate host pool and back (its code path and "
        "accounting without a GPU)"}});
  section(FlagGroup::Training, main_grad_flag_rows());
  section(
      FlagGroup::Parallel,
      {{"tensor-model-parallel-size", &C::tensor_model_parallel_size, 1, "TP", kNoRole, positive()},
       {"pipeline-model-parallel-size", &C::pipeline_model_parallel_size, 1, "PP", kNoRole, positive()},
       {"context-parallel-size", &C::context_parallel_size, 1,
        "CP: each sequence in 2CP chunks, rank r holds r, 2CP-1-r", kNoRole, positive()},
       {"cp-comm-type",
        &C::cp_comm_type,
        {"p2p"},
        "Attention over CP: p2p, a2a, allgather, a2a+p2p (one, or one per layer)",
        kNoRole,
        one_of({"p2p", "a2a", "allgather", "a2a+p2p"})},
       {"hierarchical-context-parallel-sizes",
        &C::hierarchical_context_parallel_sizes,
        {},
        "a2a+p2p: the a2a and p2p group sizes (product = CP)"},
       {"expert-model-parallel-size", &C::expert_model_parallel_size, 1, "EP", kNoRole, positive()},
       {"expert-tensor-parallel-size", &C::expert_tensor_parallel_size, 0, "ETP (default TP)", kDerived, positive()},
       {"sequence-parallel", &C::sequence_parallel, false, "Sequence parallelism (with TP)"},
       {"use-distributed-optimizer", &C::use_distributed_optimizer, false,
        "Shard fp32 master weights and Adam moments over DPxCP (dense) and EDP (experts)"},
       {"num-distributed-optimizer-instances", &C::num_distributed_optimizer_instances, 1,
        "Distributed-optimizer copies: shard over DP/K ranks, all-reduce across the K (with --use-megatron-fsdp: "
        "hybrid sharding, sharded within DP/K ranks and replicated across the K)",
        kNoRole, positive()},
       {"ddp-bucket-size", &C::ddp_bucket_size, 0,
        "Elements per gradient bucket, filled in the order gradients become final and closed at a parameter "
        "boundary once full (unset: one bucket per layer)",
        kNoRole, at_least(0)},
       {"overlap-grad-reduce", &C::overlap_grad_reduce, false,
        "Start each gradient bucket's data-parallel all-reduce (reduce-scatter with the distributed optimizer) as "
        "soon as its gradients are final in the last micro-batch's backward (default: all after backward)"},
       {"overlap-param-gather", &C::overlap_param_gather, false,
        "Distributed optimizer: the updated parameters' all-gather per bucket overlaps the next forward, waited "
        "before the first layer that uses the bucket (needs --overlap-grad-reduce)"},
       {"overlap-param-gather-with-optimizer-step", &C::overlap_param_gather_with_optimizer_step, false,
        "With --overlap-param-gather under interleaved pipelining: every bucket's all-gather dispatched in the "
        "optimizer step"},
       {"overlap-moe-expert-parallel-comm", &C::overlap_moe_expert_parallel_comm, false,
        "Overlap the MoE expert-parallel all-to-all: Megatron's combined 1F1B (a micro-batch's forward merged with "
        "the last one's backward; PP 1), or with --delay-wgrad-compute beside the experts' wgrad GEMMs"},
       {"delay-wgrad-compute", &C::delay_wgrad_compute, false,
        "Compute the experts' weight gradients after their data gradients, while the dispatch backward all-to-all "
        "runs (needs --overlap-moe-expert-parallel-comm)"},
       {"overlap-dispatch-backward-with-experts-wgrad", &C::overlap_dispatch_backward_with_experts_wgrad, false,
        "The experts' weight-gradient GEMMs beside the dispatch backward all-to-all (without "
        "--overlap-moe-expert-parallel-comm)"},
       {"use-precision-aware-optimizer", &C::use_precision_aware_optimizer, false,
        "Adam moments in --exp-avg-dtype/--exp-avg-sq-dtype (TransformerEngine's FusedAdam: stored low, computed in "
        "fp32)"},
       {"exp-avg-dtype", &C::exp_avg_dtype, "fp32", "Adam first moment storage: fp32 or bf16 (fp16, fp8: refused)",
        kNoRole, one_of({"fp32", "fp16", "bf16", "fp8"})},
       {"exp-avg-sq-dtype", &C::exp_avg_sq_dtype, "fp32",
        "Adam second moment storage: fp32 or bf16 (fp16, fp8: refused)", kNoRole,
        one_of({"fp32", "fp16", "bf16", "fp8"})},
       // Pipeline stage layouts (train/pipeline_layout.h); -1 and "" are Megatron's None.
       {"num-layers-per-virtual-pipeline-stage", &C::num_layers_per_virtual_pipeline_stage, -1,
        "Number of layers per virtual pipeline stage (-1: none)", kNoRole, at_least(-1)},
       {"num-virtual-stages-per-pipeline-rank", &C::num_virtual_stages_per_pipeline_rank, -1,
        "Number of virtual pipeline stages per pipeline parallelism rank (-1: none)", kNoRole, at_least(-1)},
       {"decoder-first-pipeline-num-layers", &C::decoder_first_pipeline_num_layers, -1,
        "The number of transformer layers on the first pipeline stage of the decoder (-1: even split of "
        "transformer layers across all pipeline stages)",
        kNoRole, at_least(-1)},
       {"decoder-last-pipeline-num-layers", &C::decoder_last_pipeline_num_layers, -1,
        "The number of transformer layers on the last pipeline stage of the decoder (-1: even split of "
        "transformer layers across all pipeline stages)",
        kNoRole, at_least(-1)},
       {"account-for-embedding-in-pipeline-split", &C::account_for_embedding_in_pipeline_split, false,
        "Count the embedding as a transformer layer when splitting the layers over pipeline stages"},
       {"account-for-loss-in-pipeline-split", &C::account_for_loss_in_pipeline_split, false,
        "Count the loss (output layer) as a transformer layer when splitting the layers over pipeline stages"},
       {"pipeline-model-parallel-layout", &C::pipeline_model_parallel_layout, "",
        "Custom stage layout, e.g. \"Et|(tt|)*2,tL\" (6 layers, 4 stages): E embedding, t decoder layer, m MTP "
        "layer, L loss; '|' separates stages (PP x virtual stages, in model-chunk order), x*n and (...)*n "
        "repeat, commas are cosmetic"},
       {"microbatch-group-size-per-virtual-pipeline-stage", &C::microbatch_group_size_per_vp_stage, 0,
        "Interleaved 1F1B: contiguous micro-batches per virtual stage (0: the pipeline size)", kNoRole, at_least(0)}});
  section(FlagGroup::Parallel, fsdp_flag_rows());
  section(
      FlagGroup::Data,
      {{"data-path", &C::data_path, {}, "Dataset prefix, or weight/prefix pairs"},
       {"split", &C::split, "969,30,1", "train,valid,test proportions"},
       {"mock-data", &C::mock_data, false, "Synthetic tokens instead of --data-path"},
       {"tokenizer-type", &C::tokenizer_type, "",
        "HuggingFaceTokenizer, GPT2BPETokenizer (the default with --vocab-file) or NullTokenizer", kNoRole,
        one_of({"", "HuggingFaceTokenizer", "GPT2BPETokenizer", "NullTokenizer"})},
       {"tokenizer-model", &C::tokenizer_model, "", "HuggingFaceTokenizer: tokenizer.json or its directory"},
       {"vocab-file", &C::vocab_file, "", "GPT2BPETokenizer: GPT-2's vocab.json"},
       {"merge-file", &C::merge_file, "", "GPT2BPETokenizer: GPT-2's merges.txt (its first line, the header, skipped)"},
       {"vocab-size", &C::vocab_size, 0, "Vocabulary with NullTokenizer or --mock-data", kNoRole, at_least(0)}});
  section(
      FlagGroup::Logging,
      {{"eval-interval", &C::eval_interval, 1000, "Steps between validations", kNoRole, positive()},
       {"eval-iters", &C::eval_iters, 100, "Global batches per validation", kNoRole, at_least(0)},
       {"log-interval", &C::log_interval, 100, "Steps between log lines", kNoRole, positive()},
       {"skip-train", &C::skip_train, false, "Only evaluate"},
       {"metrics-file", &C::metrics_file, "", "JSON lines of logged metrics"},
       {"check-weight-hash-across-dp-replicas-interval", &C::check_weight_hash_across_dp_replicas_interval, 0,
        "Every N steps check that the data-parallel replicas' weights are bitwise identical (0: off)", kNoRole,
        at_least(0)},
       {"log-throughput", &C::log_throughput, false,
        "Log line: throughput per GPU (TFLOP/s/GPU), Megatron's FLOP count"},
       {"log-params-norm", &C::log_params_norm, false, "Log line: L2 norm of all parameters (each counted once)"},
       {"log-num-zeros-in-grad", &C::log_num_zeros_in_grad, false, "Log line: zero entries of the step's gradients"},
       {"logging-level", &C::logging_level, 30,
        "Python logging level: moecore's warnings show at <= 30 (WARNING); the log line always shows"},
       {"tensorboard-dir", &C::tensorboard_dir, "",
        "TensorBoard event files (Megatron's tags), written by the last rank: tensorboard --logdir DIR"},
       {"tensorboard-log-interval", &C::tensorboard_log_interval, 1, "Steps between TensorBoard scalars", kNoRole,
        positive()},
       {"tensorboard-queue-size", &C::tensorboard_queue_size, 1000,
        "TensorBoard records held before a write to disk (also every 120 s and at exit; 0 or less: no limit)"},
       {"log-timers-to-tensorboard", &C::log_timers_to_tensorboard, false,
        "TensorBoard: iteration-time and <timer>-time of the timers --timing-log-level logs (max over ranks)"},
       {"timing-log-level", &C::timing_log_level, 0,
        "Timers kept and logged after the log line: 0 (setup, checkpoints), 1 (+ step phases), 2 (+ operations)",
        kNoRole, between(0, 2)},
       {"timing-log-option", &C::timing_log_option, "minmax", "Timers over ranks: minmax, max, or all (every rank's)",
        kNoRole, one_of({"minmax", "max", "all"})},
       {"no-barrier-with-level-1-timing", &C::no_barrier_with_level_1_timing, false,
        "No world barrier before the level-1 timers forward-backward and optimizer start"},
       {"no-log-loss-scale-to-tensorboard", &C::no_log_loss_scale_to_tensorboard, false,
        "TensorBoard: no loss-scale (1.0 without --loss-scale, --fp16)"},
       {"disable-log-loss-scale-to-tensorboard", &C::no_log_loss_scale_to_tensorboard, false,
        "Megatron's other spelling of --no-log-loss-scale-to-tensorboard"},
       {"log-validation-ppl-to-tensorboard", &C::log_validation_ppl_to_tensorboard, false,
        "TensorBoard: validation perplexity"},
       {"log-memory-to-tensorboard", &C::log_memory_to_tensorboard, false,
        "TensorBoard: mem-* of the host allocator (bytes live, peak, obtained; live blocks)"},
       {"log-world-size-to-tensorboard", &C::log_world_size_to_tensorboard, false, "TensorBoard: world-size"},
       {"generate-prompts", &C::generate_prompts, {}, "Prompts to sample from after training"},
       {"generate-tokens", &C::generate_tokens, 48, "Tokens to sample per prompt", kNoRole, at_least(0)},
       {"generate-top-k", &C::generate_top_k, 20, "Top-k for sampling", kNoRole, at_least(0)},
       {"generate-temperature", &C::generate_temperature, 0.8, "Sampling temperature", kNoRole, positive()}});
  section(FlagGroup::Logging,  // health alarms (train/routing_health.h)
          {{"moe-dead-expert-steps", &C::moe_dead_expert_steps, 100,
            "Alarm when an expert of a MoE layer gets no tokens (over all ranks) for N steps in a row (0: off)",
            kNoRole, at_least(0)},
           {"moe-load-imbalance-threshold", &C::moe_load_imbalance_threshold, 4.0,
            "Alarm when a MoE layer's max/mean tokens per expert stays above this for --moe-load-imbalance-steps "
            "(0: off)",
            kNoRole, at_least(0)},
           {"moe-load-imbalance-steps", &C::moe_load_imbalance_steps, 100,
            "Steps in a row for --moe-load-imbalance-threshold", kNoRole, positive()},
           {"moe-router-entropy-collapse-fraction", &C::moe_router_entropy_collapse_fraction, 0.1,
            "Alarm when a MoE layer's mean per-token router entropy stays below this fraction of ln(experts) for "
            "--moe-router-entropy-collapse-steps (0: off)",
            kNoRole, between(0, 1)},
           {"moe-router-entropy-collapse-steps", &C::moe_router_entropy_collapse_steps, 100,
            "Steps in a row for --moe-router-entropy-collapse-fraction", kNoRole, positive()},
           {"moe-aux-loss-spike-factor", &C::moe_aux_loss_spike_factor, 3.0,
            "Alarm when a MoE layer's aux loss reaches this factor x its max over the first "
            "--moe-aux-loss-spike-samples steps (0: off)",
            kNoRole, at_least(0)},
           {"moe-aux-loss-spike-samples", &C::moe_aux_loss_spike_samples, 100,
            "Steps whose aux losses set the max for --moe-aux-loss-spike-factor", kNoRole, positive()},
           {"loss-spike-factor", &C::loss_spike_factor, 10.0,
            "Alarm when the lm loss reaches this factor x its max over the first --loss-spike-samples steps "
            "(Megatron's spiky-loss rule, 10; 0: off)",
            kNoRole, at_least(0)},
           {"loss-spike-samples", &C::loss_spike_samples, 100,
            "Steps (after the first) whose losses set the max for --loss-spike-factor (Megatron: 100)", kNoRole,
            positive()},
           {"check-for-spiky-loss", &C::check_for_spiky_loss, false,
            "Megatron's spiky-loss check (warns on a loss >= 10x the max of the first 100): on by default in "
            "moecore as --loss-spike-factor; refused with --loss-spike-factor 0"},
           {"no-check-for-nan-in-loss-and-grad", &C::no_check_for_nan_in_loss_and_grad, false,
            "Apply a step whose loss or gradient norm is NaN/inf and go on, as Megatron (warns; saving non-finite "
            "weights is still refused); default: stop naming the first non-finite tensor"},
           {"health-alarm-stop",
            &C::health_alarm_stop,
            {},
            "Health alarms that stop the run (before saving that step) instead of warning (a list)",
            kNoRole,
            one_of({"dead-expert", "load-imbalance", "router-entropy-collapse", "aux-loss-spike", "loss-spike"})}});
  section(
      FlagGroup::Checkpoint,
      {{"save", &C::save, "",
        "Checkpoint root: iter_NNNNNNN directories and latest_checkpointed_iteration.txt (also saved at the end and "
        "on SIGTERM/SIGINT)"},
       {"save-interval", &C::save_interval, 0, "Steps between checkpoints (0: at the end only)", kNoRole, at_least(0)},
       {"load", &C::load, "",
        "Checkpoint root (its latest iteration) or iteration directory to resume; none there: start from scratch"},
       {"ckpt-step", &C::ckpt_step, -1,
        "Load iteration N of --load (its iter_NNNNNNN directory), not the one its marker names (-1: the marker's)",
        kNoRole, at_least(-1)},
       {"finetune", &C::finetune, false,
        "Load only the model weights from --load: iteration, optimizer, RNG and data position start afresh"},
       {"no-load-optim", &C::no_load_optim, false, "Do not load the optimizer state (Adam moments)"},
       {"no-load-rng", &C::no_load_rng, false, "Do not load the RNG state (router noise counters)"},
       {"use-checkpoint-args", &C::use_checkpoint_args, false,
        "Take the model flags (layers, sizes, experts, routing) from the checkpoint in --load"},
       {"exit-interval", &C::exit_interval, 0, "Save (with --save) and exit at iterations divisible by this", kNoRole,
        at_least(0)},
       {"exit-signal-handler", &C::exit_signal_handler, false,
        "Stop at the next step boundary on --exit-signal, saving with --save (moecore also does so on SIGTERM, "
        "SIGINT, SIGUSR1 and SIGUSR2 whenever --save is given)"},
       {"exit-signal", &C::exit_signal, "SIGTERM",
        "The signal --exit-signal-handler waits for (a name, as Megatron's signal.Signals: SIGTERM, SIGINT, SIGUSR1, "
        "SIGUSR2, SIGHUP, SIGQUIT, SIGALRM, ...)"},
       {"load-hf", &C::load_hf, "",
        "HuggingFace model directory (Qwen3MoeForCausalLM, MixtralForCausalLM) to start from, unless --load holds a "
        "checkpoint"},
       {"moe-use-upcycling", &C::moe_use_upcycling, false,
        "Turn the dense checkpoint in --load into this MoE model, save it to --save and train on (resumes from "
        "--save once it holds a checkpoint)"},
       {"moe-upcycling-granularity", &C::moe_upcycling_granularity, 1,
        "Experts cut from one dense FFN: --ffn-hidden-size / --moe-ffn-hidden-size", kNoRole, at_least(1)},
       {"ckpt-format", &C::ckpt_format, "moecore",
        "Checkpoint format: moecore's own; Megatron's (torch_dist, its default, and the others) select it too, listed "
        "at the start as without effect (bring a Megatron checkpoint over through HuggingFace and moecore convert "
        "hf-to-native)",
        kNoRole, one_of(ckpt_formats())},
       {"fault-kill-during-save", &C::fault_kill_during_save, "",
        "Testing crash safety: RANK:ITERATION makes that rank SIGKILL itself in the middle of that save"},
       // run control: collective timeout, timed exit, retained and asynchronous saves
       {"distributed-timeout-minutes", &C::distributed_timeout_minutes, 10,
        "A collective waiting longer ends the job, naming the collective and the ranks that did not arrive", kNoRole,
        positive()},
       {"testing-collective-timeout-seconds", &C::testing_collective_timeout_seconds, 0,
        "Testing: the collective timeout in seconds, instead of --distributed-timeout-minutes (0: that flag)", kNoRole,
        at_least(0)},
       {"testing-stall", &C::testing_stall, "",
        "Testing the collective timeout: RANK:ITERATION:SECONDS makes that rank sleep before that step"},
       {"exit-duration-in-mins", &C::exit_duration_in_mins, 0,
        "Save (with --save) and exit once this many minutes have passed since the process started (0: off)", kNoRole,
        at_least(0)},
       {"save-retain-interval", &C::save_retain_interval, 0,
        "After each save, delete this run's older checkpoints but those at iterations divisible by it (0: keep all)",
        kNoRole, at_least(0)},
       {"keep-last-checkpoints", &C::keep_last_checkpoints, 0,
        "moecore: after each save, keep only the newest K checkpoints this run wrote (0: keep all)", kNoRole,
        at_least(0)},
       {"async-save", &C::async_save, false,
        "Write checkpoints in a background thread while training goes on; the marker moves once every rank's "
        "files are complete"},
       {"verify-integrity", &C::verify_integrity, false,
        "Each save hashes its files into integrity.json; a load verifies them (missing or changed: an error)"}});
  return t;
}

}  // namespace

const std::vector<FlagSpec>& flag_table() {
  static const std::vector<FlagSpec> table = build_flag_table();
  return table;
}

TrainConfig::TrainConfig() {
  for (const auto& f : flag_table())
    std::visit([&](auto m) { this->*m = std::get<std::decay_t<decltype(this->*m)>>(f.default_value); }, f.field);
}

std::string dashed(std::string name) {
  for (char& ch : name)
    if (ch == '_') ch = '-';
  return name;
}

const FlagSpec* find_flag(const std::string& name) {
  for (const auto& f : flag_table())
    if (f.name == name) return &f;
  for (const auto& f : flag_table())  // Megatron spells a few both ways: --override-opt_param-scheduler
    if (f.name.find('_') != std::string::npos && dashed(f.name) == name) return &f;
  return nullptr;
}

const FlagSpec& flag_of(const FlagSpec::Field& field) {
  for (const auto& f : flag_table())
    if (f.field == field) return f;
  MOE_ASSERT_MSG(false, "a TrainConfig field without a flag");
}

std::string group_name(FlagGroup g) {
  static const char* const names[] = {"Model",
                                      "Mixture of experts",
                                      "Parallelism",
                                      "Optimizer and schedule",
                                      "Data",
                                      "Checkpoints",
                                      "Evaluation, logging and generation"};
  return names[static_cast<int>(g)];
}

std::vector<std::string> flag_names(unsigned roles, std::optional<FlagGroup> group) {
  std::vector<std::string> names;
  for (const auto& f : flag_table())
    if ((f.roles & roles) == roles && (!group || f.group == *group)) names.push_back(f.name);
  return names;
}

}  // namespace moecore::train
