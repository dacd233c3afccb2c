// The one training configuration: Megatron-LM flag names, declared once in the flag table (name, field, default,
// help, roles, accepted values, group; a flag's field below is value-initialised and TrainConfig's constructor sets
// it to the table's default). Parsing, YAML, --help, the printed configuration, saved
// checkpoint args and the role lists (model identity, schedule) all derive from the table. Two passes make a
// config usable: resolve_defaults fills derived values, validate checks; resolve runs both once and stamps the
// config, and the Trainer accepts only a stamped, unchanged config. Only train/ and cli/ see it; modules get their
// own small config structs from it. Composition of presets, HF config and checkpoint args: start_config.h.
#pragma once

#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "moecore/moe/moe_layer.h"
#include "moecore/nn/fp8_recipe.h"
#include "moecore/nn/gpt_model.h"
#include "moecore/optim/lr_schedule.h"

namespace moecore::train {

struct TrainConfig {
  TrainConfig();  // every flag's field at its table default (flag_table.cpp)

  // model
  std::string model{};  // preset name, or empty
  int64_t num_layers{}, hidden_size{}, ffn_hidden_size{}, num_attention_heads{};
  bool group_query_attention{};
  int64_t num_query_groups{}, kv_channels{};
  bool qk_layernorm{};
  int64_t seq_length{}, max_position_embeddings{};
  double rotary_base{}, rotary_percent{};
  std::string position_embedding_type{}, normalization{};
  bool apply_layernorm_1p{}, no_position_embedding{};
  double norm_epsilon{};
  bool untie_embeddings_and_output_weights{};
  bool swiglu{}, squared_relu{};
  bool disable_bias_linear{};
  double init_method_std{};
  int64_t make_vocab_size_divisible_by{}, padded_vocab_size{};  // padded_vocab_size 0: Megatron's None (padded)
  double hidden_dropout{}, attention_dropout{};                 // training only
  // Multi-Latent Attention and its RoPE (nn/mla_attention.h). q_lora_rank 0: unset (Megatron's None, a direct q
  // projection); rope_type empty: unset (Megatron's None: yarn with MLA, rope otherwise).
  bool multi_latent_attention{};
  int64_t q_lora_rank{}, kv_lora_rank{}, qk_head_dim{}, qk_pos_emb_head_dim{}, v_head_dim{};
  std::string rope_type{};
  double rotary_scaling_factor{}, mscale{}, mscale_all_dim{};
  // MLA's YaRN ramp and original context: MLATransformerConfig's beta_fast, beta_slow and
  // original_max_position_embeddings, set here through Megatron's --yarn-* flags (docs/differences.md).
  double yarn_beta_fast{}, yarn_beta_slow{};
  int64_t yarn_original_max_position_embeddings{};
  // Multi-token prediction (nn/mtp.h): --mtp-num-layers (0: Megatron's None, off), --mtp-loss-scaling-factor.
  int64_t mtp_num_layers{};
  double mtp_loss_scaling_factor{};
  // MoE
  int64_t num_experts{}, moe_ffn_hidden_size{}, moe_router_topk{};
  std::string moe_router_score_function{};
  bool moe_router_pre_softmax{};
  double moe_router_topk_scaling_factor{};
  int64_t moe_router_num_groups{}, moe_router_group_topk{};
  bool moe_router_enable_expert_bias{};
  double moe_router_bias_update_rate{};
  std::vector<std::string> moe_router_load_balancing_type{};
  std::vector<std::string> moe_aux_loss_coeff{};
  double moe_z_loss_coeff{}, moe_input_jitter_eps{};
  bool moe_router_force_load_balancing{};
  std::string moe_router_dtype{};
  double moe_expert_capacity_factor{};
  std::string moe_token_drop_policy{};
  bool moe_pad_expert_input_to_capacity{};
  int64_t moe_shared_expert_intermediate_size{};
  bool moe_shared_expert_gate{};
  bool moe_shared_expert_overlap{};  // GPU: shared experts on a second stream (device/side_stream.h)
  std::string moe_layer_freq{};
  bool moe_grouped_gemm{};
  std::string moe_token_dispatcher_type{};
  std::string moe_flex_dispatcher_backend{};  // flex's backend: deepep or hybridep (the same math in moecore)
  bool moe_enable_deepep{};                   // Megatron's older spelling of --moe-flex-dispatcher-backend deepep
  bool moe_per_layer_logging{};
  // training
  int64_t micro_batch_size{}, global_batch_size{}, train_iters{};
  double lr{}, min_lr{};
  std::string lr_decay_style{}, lr_wsd_decay_style{};
  int64_t lr_warmup_iters{}, lr_decay_iters{}, lr_wsd_decay_iters{};
  double weight_decay{}, clip_grad{}, adam_beta1{}, adam_beta2{}, adam_eps{};
  std::string optimizer{};
  // sample-based training, the scheduler's other flags, per-token loss (-1: unset where Megatron has None)
  int64_t train_samples{}, lr_decay_samples{}, lr_warmup_samples{}, lr_wsd_decay_samples{};
  double lr_warmup_fraction{}, lr_warmup_init{};
  double start_weight_decay{}, end_weight_decay{};
  std::string weight_decay_incr_style{};
  bool use_checkpoint_opt_param_scheduler{}, override_opt_param_scheduler{};
  bool calculate_per_token_loss{}, eod_mask_loss{};
  // optimizers beside adam (optim/sgd.h, optim/muon.h)
  double sgd_momentum{}, muon_momentum{}, muon_extra_scale_factor{};
  bool muon_nesterov{}, muon_no_split_qkv{};
  std::string muon_scale_mode{}, muon_fp32_matmul_prec{}, muon_coefficient_type{};
  std::string muon_tp_mode{}, muon_scalar_optimizer{};
  int64_t muon_num_ns_steps{}, num_distributed_optimizer_instances{};
  int64_t ddp_bucket_size{};  // elements per gradient bucket (0: unset, one bucket per layer)
  // Megatron's communication overlaps (docs/megatron-flags.md): the data-parallel gradient reduction during the last
  // micro-batch's backward, the distributed optimizer's parameter all-gather during the next forward (or dispatched
  // in the optimizer step), the MoE dispatch-backward all-to-all beside the delayed expert weight gradients.
  bool overlap_grad_reduce{}, overlap_param_gather{}, overlap_param_gather_with_optimizer_step{};
  bool overlap_moe_expert_parallel_comm{}, delay_wgrad_compute{};
  bool overlap_dispatch_backward_with_experts_wgrad{};
  double decoupled_lr{}, decoupled_min_lr{};  // -1: none (Megatron's None)
  int64_t seed{};
  bool bf16{};
  // fp16 and loss scaling (optim/grad_scaler.h; Megatron's --loss-scale 0 is its None); the main gradients' dtype
  // (optimizer_config.h grad_precision: fp16 under --fp16 without --accumulate-allreduce-grads-in-fp32, bf16 under
  // --bf16 with --grad-reduce-in-bf16 or --main-grads-dtype bf16).
  bool fp16{}, accumulate_allreduce_grads_in_fp32{}, grad_reduce_in_bf16{};
  std::string main_grads_dtype{};
  double loss_scale{}, initial_loss_scale{}, min_loss_scale{}, loss_scale_window{};
  int64_t hysteresis{};
  // FP8 GEMMs (nn/fp8_recipe.h): fp8_format "" is off (Megatron's None).
  std::string fp8_format{}, fp8_recipe{}, fp8_amax_compute_algo{};
  int64_t fp8_margin{}, fp8_amax_history_len{};
  bool first_last_layers_bf16{};
  // --fp8-param-gather: the FP8 sites' weights held as FP8 (rounded from the fp32 masters after each step) and
  // all-gathered in FP8 (nn/fp8_param.h).
  bool fp8_param_gather{};
  int64_t num_layers_at_start_in_bf16{}, num_layers_at_end_in_bf16{};
  // activation recompute (nn/recompute.h); "" and 0 stand for Megatron's None
  std::string recompute_granularity{}, recompute_method{};
  int64_t recompute_num_layers{};
  std::vector<std::string> recompute_modules{};  // empty: Megatron's default, core_attn
  bool recompute_activations{}, moe_layer_recompute{};
  // fine-grained activation offloading (train/activation_offload.h); -1 stands for Megatron's None
  bool fine_grained_activation_offloading{};
  std::vector<std::string> offload_modules{};
  int64_t min_offloaded_tensor_size{}, fine_grained_offloading_max_inflight_offloads{};
  bool testing_offload_on_cpu{};  // the offloading's copies on a CPU run, to a separate host pool (tests)
  // parallelism (one process until the distributed issue)
  int64_t tensor_model_parallel_size{}, pipeline_model_parallel_size{}, context_parallel_size{},
      expert_model_parallel_size{}, expert_tensor_parallel_size{};
  bool sequence_parallel{};
  bool use_distributed_optimizer{};
  // Megatron FSDP (optim/fsdp.h): what is sharded over the data-parallel group (ZeRO-0..3), the outer group of
  // hybrid sharding (HSDP, with --num-distributed-optimizer-instances > 1), the dtypes of the main parameters
  // ("fp32" or "auto"; the rest refused), gradients and gradient collectives, the gather double buffer, and each rank
  // initialising only its shard.
  bool use_megatron_fsdp{}, fsdp_double_buffer{}, init_model_with_meta_device{};
  std::string data_parallel_sharding_strategy{}, outer_dp_sharding_strategy{};
  std::string megatron_fsdp_main_params_dtype{}, megatron_fsdp_main_grads_dtype{}, megatron_fsdp_grad_comm_dtype{};
  // Megatron's precision-aware optimizer (TransformerEngine's FusedAdam): Adam moments stored in bf16, computed in
  // fp32 (--use-precision-aware-optimizer --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16).
  bool use_precision_aware_optimizer{};
  std::string exp_avg_dtype{}, exp_avg_sq_dtype{};
  // context parallelism (train/context_parallel.h): one --cp-comm-type for every layer or one per layer; the
  // hierarchical sizes as given (integers, validated)
  std::vector<std::string> cp_comm_type{}, hierarchical_context_parallel_sizes{};
  // pipeline stage layouts (train/pipeline_layout.h; -1 and "": unset, Megatron's None)
  int64_t num_layers_per_virtual_pipeline_stage{}, num_virtual_stages_per_pipeline_rank{};
  int64_t decoder_first_pipeline_num_layers{}, decoder_last_pipeline_num_layers{};
  bool account_for_embedding_in_pipeline_split{}, account_for_loss_in_pipeline_split{};
  std::string pipeline_model_parallel_layout{};
  int64_t microbatch_group_size_per_vp_stage{};  // interleaved 1F1B's micro-batch groups (0: Megatron's None)
  // data
  std::vector<std::string> data_path{};
  std::string split{};
  bool mock_data{};
  std::string tokenizer_type{}, tokenizer_model{}, vocab_file{}, merge_file{};
  int64_t vocab_size{};
  // evaluation, logging, generation
  int64_t eval_interval{}, eval_iters{}, log_interval{};
  bool skip_train{};
  std::string metrics_file{};
  // Megatron's logging flags (train/metrics.cpp): the log line's throughput, params norm and gradient zeros;
  // --logging-level gates moecore's warnings as Python's logging level gates Megatron's (30: WARNING, the default).
  int64_t check_weight_hash_across_dp_replicas_interval{};  // 0: off (Megatron's None)
  bool log_throughput{}, log_params_norm{}, log_num_zeros_in_grad{};
  int64_t logging_level{};
  // TensorBoard event files (train/tensorboard_log.h), written by the last rank as Megatron's are
  std::string tensorboard_dir{};
  int64_t tensorboard_log_interval{}, tensorboard_queue_size{};
  bool log_timers_to_tensorboard{}, no_log_loss_scale_to_tensorboard{};
  bool log_validation_ppl_to_tensorboard{}, log_memory_to_tensorboard{};
  bool log_world_size_to_tensorboard{};
  // Megatron's timers (train/timers.h): which are kept (0: the few Megatron always logs; 1: per step phase;
  // 2: per operation), how the log shows them over ranks, and the world barrier before the level-1 phases.
  int64_t timing_log_level{};
  std::string timing_log_option{};
  bool no_barrier_with_level_1_timing{};
  // Health alarms (train/routing_health.h): each on by default, 0 turns one off; --health-alarm-stop names those
  // that stop the run instead of warning. Megatron's --check-for-spiky-loss (its factor 10 over 100 samples is
  // moecore's default --loss-spike-factor/-samples) and --no-check-for-nan-in-loss-and-grad (the step is applied).
  int64_t moe_dead_expert_steps{}, moe_load_imbalance_steps{}, moe_router_entropy_collapse_steps{};
  double moe_load_imbalance_threshold{}, moe_router_entropy_collapse_fraction{};
  double moe_aux_loss_spike_factor{}, loss_spike_factor{};
  int64_t moe_aux_loss_spike_samples{}, loss_spike_samples{};
  bool check_for_spiky_loss{}, no_check_for_nan_in_loss_and_grad{};
  std::vector<std::string> health_alarm_stop{};
  std::vector<std::string> generate_prompts{};
  int64_t generate_tokens{}, generate_top_k{};
  double generate_temperature{};
  // checkpoints
  std::string save{}, load{}, load_hf{};
  int64_t save_interval{}, exit_interval{};
  bool exit_signal_handler{};
  std::string exit_signal{};
  int64_t ckpt_step{};  // -1: the iteration the marker names
  bool finetune{}, no_load_optim{}, no_load_rng{};
  bool use_checkpoint_args{};
  bool moe_use_upcycling{};
  int64_t moe_upcycling_granularity{};
  std::string ckpt_format{};             // Megatron's formats: no effect (ckpt/foreign_checkpoint.h)
  std::string fault_kill_during_save{};  // "RANK:ITERATION" (crash-safety tests)
  int64_t testing_memory_limit{};        // bytes the run may use instead of the detected limit (memory tests)
  std::string device{};                  // --device auto|cpu|cuda (cuda/device_select.h, docs/cuda.md)
  // run control (runcontrol): collective timeout, timed exit, retained and asynchronous saves
  int64_t distributed_timeout_minutes{};
  double testing_collective_timeout_seconds{};  // > 0: replaces --distributed-timeout-minutes (tests)
  std::string testing_stall{};                  // "RANK:ITERATION:SECONDS" (watchdog tests)
  int64_t exit_duration_in_mins{};              // 0: off (Megatron's None)
  int64_t save_retain_interval{};               // 0: off (Megatron's None)
  int64_t keep_last_checkpoints{};              // 0: off (moecore's own)
  bool async_save{};
  bool verify_integrity{};  // Megatron's: an integrity manifest written with each save, verified on load

  // Bookkeeping of resolve(), not flags: the flags resolve_defaults derived with their values (the next
  // resolve_defaults derives those still holding them anew), and a fingerprint of the values resolve() validated
  // (0: never resolved).
  std::vector<std::pair<std::string, int64_t>> derived;
  uint64_t resolved_fingerprint = 0;
  // Bookkeeping too: the Megatron flags given that have no effect here, "--flag [value]: why" (megatron_flags.h);
  // the run lists them at its start.
  std::vector<std::string> no_effect;
  // Bookkeeping too: set by `moecore plan`, which plans a run without running it: a GPU named by --device is
  // assumed present (device/device_select.h, DeviceAvailability::assumed_for), so a GPU cluster plans from a laptop.
  bool plan_only = false;
  // Resolved by resolve(), not a flag: per layer, whether it is a MoE layer (--moe-layer-freq over --num-layers; none
  // without --num-experts). Every user reads this; the flag's string is what checkpoints save.
  std::vector<bool> is_moe_layer;
};

// --help groups the flags by these.
enum class FlagGroup { Model, MoE, Parallel, Training, Data, Checkpoint, Logging };

// What a flag means beyond its own value (a bit set).
enum FlagRole : unsigned {
  kNoRole = 0,
  // Fixes the model's weights and what they compute: a resumed run must match its checkpoint on it.
  kIdentity = 1,
  // Taken from the checkpoint by --use-checkpoint-args (every identity flag, and a few that only shape the model).
  kCheckpointArg = 2,
  // The learning-rate schedule: a resumed run must match its checkpoint on it too.
  kSchedule = 4,
  // Filled by resolve_defaults when left at its default (its help says from what).
  kDerived = 8,
  // One value written as a Python list expression ("[0,1,1]"), which CLI11 must not split into several.
  kListExpression = 16,
};
inline constexpr unsigned kModel = kIdentity | kCheckpointArg;

// What a flag accepts beyond its type: validate checks it (after resolve_defaults, so derived values too) and
// --help shows it. Numbers lie in [min, max], an end open where said; a double must also be finite, always. A
// string, or each element of a list, is one of `choices` when there are any.
struct Accepts {
  static constexpr double kInf = std::numeric_limits<double>::infinity();
  double min = -kInf, max = kInf;
  bool min_open = false, max_open = false;
  std::vector<std::string> choices;
  bool any() const { return min == -kInf && max == kInf && choices.empty(); }
  std::string describe() const;  // "> 0", "in [0, 1)", "one of: a, b"; empty when anything is accepted
};
inline Accepts positive() {
  return {0, Accepts::kInf, true, false, {}};
}
inline Accepts at_least(double lo) {
  return {lo, Accepts::kInf, false, false, {}};
}
inline Accepts between(double lo, double hi, bool hi_open = false) {
  return {lo, hi, false, hi_open, {}};
}
inline Accepts above_to(double lo, double hi) {  // (lo, hi]
  return {lo, hi, true, false, {}};
}
inline Accepts one_of(std::vector<std::string> choices) {
  return {-Accepts::kInf, Accepts::kInf, false, false, std::move(choices)};
}

// A flag: its name without dashes, the TrainConfig field it sets (the field's type is the flag's type), its default,
// help, roles, what it accepts, and its group (set by the table's section). A table row reads
// {"name", &TrainConfig::field, default, "help", roles, accepts}; the default converts to the field's type.
struct FlagSpec {
  using Field = std::variant<int64_t TrainConfig::*, double TrainConfig::*, bool TrainConfig::*,
                             std::string TrainConfig::*, std::vector<std::string> TrainConfig::*>;
  using Value = std::variant<int64_t, double, bool, std::string, std::vector<std::string>>;
  template <class T>
  FlagSpec(std::string name_, T TrainConfig::*field_, std::type_identity_t<T> default_, std::string help_,
           unsigned roles_ = kNoRole, Accepts accepts_ = {})
      : name(std::move(name_)),
        field(field_),
        default_value(std::move(default_)),
        help(std::move(help_)),
        roles(roles_),
        accepts(std::move(accepts_)) {}
  std::string name;
  Field field;
  Value default_value;  // holds the field's type
  std::string help;
  unsigned roles = kNoRole;
  Accepts accepts = {};
  FlagGroup group = FlagGroup::Model;
};

// The table, in flag order (grouped).
const std::vector<FlagSpec>& flag_table();
const FlagSpec* find_flag(const std::string& name);     // null if none; also by dashed(name)
std::string dashed(std::string name);                   // '_' -> '-': Megatron accepts both for a few flags
const FlagSpec& flag_of(const FlagSpec::Field& field);  // the flag that sets `field`
std::string group_name(FlagGroup g);
// Names of the flags with every bit of `roles`, in table order; with `group`, only that group's.
std::vector<std::string> flag_names(unsigned roles, std::optional<FlagGroup> group = std::nullopt);

// One flag's value: set from strings as given on the command line or in YAML (converted and type-checked, the
// errors naming the flag), and printed.
void set_flag(TrainConfig& c, const FlagSpec& f, const std::vector<std::string>& values);
std::string flag_value(const TrainConfig& c, const FlagSpec& f);
int64_t to_int(const std::string& flag, const std::string& v);
double to_double(const std::string& flag, const std::string& v);

// The flags one source sets, in its order, keyed by canonical flag name (dashes), values as given.
struct FlagLayer {
  std::string source;  // "the command line" or "--config FILE"
  std::vector<std::pair<std::string, std::vector<std::string>>> values;
};
void apply_flags(TrainConfig& c, const FlagLayer& layer);

// Thrown by parse_flags (and so parse_train_config) for --help: the text to print.
struct HelpRequested {
  std::string text;
};

// `base` with `extra` appended, every flag `extra` sets removed from `base` first (with its values): how
// benchmarks and tests override a model's flags with a command line that names each flag once.
std::vector<std::string> override_flags(std::vector<std::string> base, const std::vector<std::string>& extra);

// What `moecore train` arguments say, unapplied: the --config YAML file's flags and the command line's. A flag
// given twice on the command line keeps its last value, as argparse does (a list flag its last occurrence's
// values). Reads no file but that YAML; throws Error on unknown flags or keys and malformed YAML, HelpRequested for
// --help.
struct ParsedFlags {
  FlagLayer yaml, cli;
  // The Megatron flags with a rule instead of a table row (megatron_flags.h) the YAML and the command line gave,
  // each once, in the order first given, the command line's values over the YAML's; parse_flags has refused the
  // refused ones.
  std::vector<std::pair<std::string, std::vector<std::string>>> megatron;
};
ParsedFlags parse_flags(const std::vector<std::string>& args);

// Pass 1: fill the derived defaults (kv-channels, ffn-hidden-size, ...: the kDerived flags) left at their default
// or derived by an earlier pass, recording which in c.derived.
void resolve_defaults(TrainConfig& c);
// Pass 2: throws Error naming the flag, the value and the fix for anything rejected. Expects resolved defaults.
// First every flag against its table row (Accepts), then the relations between flags (Megatron's argument checks),
// by concern (config_validate.h).
void validate(const TrainConfig& c);
// One flag's value against its table row; throws Error naming the flag, the value and what is accepted.
void check_accepted(const TrainConfig& c, const FlagSpec& f);
// Both passes, then --moe-layer-freq parsed into c.is_moe_layer (a bad form refused naming the flag), then stamps the
// config as resolved; call it again after changing a field.
void resolve(TrainConfig& c);
// Whether `c` went through resolve() and has not changed since.
bool is_resolved(const TrainConfig& c);

// "key: value" lines in flag order (derived values marked), for the start of a run.
std::string describe(const TrainConfig& c);
// The configuration as a JSON object keyed by flag name (checkpoints store it), and back: every key of `j` that
// is a flag name sets that field (types checked; `where` names the source in errors).
nlohmann::json config_json(const TrainConfig& c);
void apply_config_json(TrainConfig& c, const nlohmann::json& j, const std::string& where);

// The model's 16-bit float: bf16 under --bf16, f16 under --fp16, none (f32) otherwise; every module's config takes
// it from here.
LowPrecision low_precision(const TrainConfig& c);
nn::GPTConfig gpt_config(const TrainConfig& c, int64_t padded_vocab);
// The module configs, each built from the resolved config by its one function (modules never see TrainConfig).
moe::RouterConfig router_config(const TrainConfig& c);
moe::MoELayerConfig moe_layer_config(const TrainConfig& c);  // its router from router_config
// Megatron's combined 1F1B schedule: --overlap-moe-expert-parallel-comm without --delay-wgrad-compute, in training.
bool combined_1f1b(const TrainConfig& c);
nn::Fp8Config fp8_config(const TrainConfig& c);  // config_fp8.cpp
optim::LRSchedule lr_schedule(const TrainConfig& c);
// The embedding's rows for a vocabulary of `vocab` ids: --padded-vocab-size when given (Megatron then uses it as is),
// else `vocab` padded to a multiple of --make-vocab-size-divisible-by (× TP), as Megatron pads it.
int64_t padded_vocab_size(const TrainConfig& c, int64_t vocab);

}  // namespace moecore::train
