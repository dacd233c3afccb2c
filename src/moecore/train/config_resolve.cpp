// The two passes that make a parsed configuration usable (see config.h): resolve_defaults fills the values Megatron
// derives from others (each recorded, so a later pass derives it again), validate checks everything and changes
// nothing. resolve runs both and stamps the result; the Trainer takes only stamped, unchanged configurations.
#include <cmath>
#include <functional>
#include <limits>
#include <utility>

#include "moecore/core/error.h"
#include "moecore/train/config.h"
#include "moecore/train/signals.h"

namespace moecore::train {

namespace {

uint64_t fingerprint(const TrainConfig& c) {
  const uint64_t h = std::hash<std::string>{}(config_json(c).dump());
  return h != 0 ? h : 1;  // 0 means never resolved
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
  if (c.lr_decay_iters == 0) derive(&TrainConfig::lr_decay_iters, c.train_iters);
  if (c.num_experts > 0 && c.moe_ffn_hidden_size == 0) derive(&TrainConfig::moe_ffn_hidden_size, c.ffn_hidden_size);
}

void validate(const TrainConfig& c) {
  // Not derivable (H not divisible by the heads) says more than "--kv-channels 0 is out of range".
  MOE_CHECK(c.kv_channels != 0 || c.hidden_size <= 0 || c.num_attention_heads <= 0,
            "--hidden-size {} is not divisible by --num-attention-heads {}; set --kv-channels", c.hidden_size,
            c.num_attention_heads);
  for (const auto& f : flag_table()) check_accepted(c, f);
  for (const auto& v : c.moe_aux_loss_coeff) {
    const double x = to_double("moe-aux-loss-coeff", v);
    MOE_CHECK(std::isfinite(x) && x >= 0, "--moe-aux-loss-coeff {} is out of range; accepted: finite numbers >= 0", v);
  }
  auto pos = [](int64_t v, const char* n) { MOE_CHECK(v > 0, "--{} must be positive, got {}", n, v); };
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
  padded_vocab_size(c, c.vocab_size);  // throws when padding overflows
  for (auto [v, n] : {std::pair{c.pipeline_model_parallel_size, "pipeline-model-parallel-size"},
                      std::pair{c.context_parallel_size, "context-parallel-size"}})
    MOE_CHECK(v == 1,
              "--{} {}: pipeline and context parallelism are not available yet; run with 1 (tensor, sequence, "
              "data, expert and expert-tensor parallelism over mpirun ranks are)",
              n, v);
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
            "--exit-signal {} is not supported; choose SIGTERM, SIGINT, SIGUSR1, SIGUSR2 or SIGHUP", c.exit_signal);
  MOE_CHECK(c.save_interval == 0 || !c.save.empty(), "--save-interval {} without --save: add --save DIR",
            c.save_interval);
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
  MOE_CHECK(c.optimizer == "adam", "--optimizer {} is rejected: moecore has adam (AdamW) only", c.optimizer);
  MOE_CHECK(c.global_batch_size % c.micro_batch_size == 0,
            "--global-batch-size {} must be a multiple of --micro-batch-size {} x data-parallel size 1",
            c.global_batch_size, c.micro_batch_size);
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
    MOE_CHECK(c.disable_bias_linear,
              "--num-experts with linear biases: moecore's experts have no bias; pass --disable-bias-linear");
    MOE_CHECK(c.moe_grouped_gemm, "moe-grouped-gemm: false is rejected: moecore always runs experts as grouped GEMMs");
    MOE_CHECK(c.moe_token_dispatcher_type == "alltoall" || c.moe_token_dispatcher_type == "allgather",
              "--moe-token-dispatcher-type {} is rejected; use alltoall or allgather", c.moe_token_dispatcher_type);
    MOE_CHECK(c.expert_model_parallel_size >= 1 && c.num_experts % c.expert_model_parallel_size == 0,
              "--num-experts {} is not divisible by --expert-model-parallel-size {}", c.num_experts,
              c.expert_model_parallel_size);
    MOE_CHECK(c.moe_ffn_hidden_size % etp == 0,
              "--moe-ffn-hidden-size {} must be divisible by --expert-tensor-parallel-size {}", c.moe_ffn_hidden_size,
              etp);
    moe::validate(moe_layer_config(c));
    moe::parse_moe_layer_freq(c.moe_layer_freq, c.num_layers);
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
  validate(c);
  c.resolved_fingerprint = fingerprint(c);
}

bool is_resolved(const TrainConfig& c) {
  return c.resolved_fingerprint != 0 && c.resolved_fingerprint == fingerprint(c);
}

}  // namespace moecore::train
