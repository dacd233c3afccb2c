// validate()'s model checks (see config_validate.h): attention heads and positions, Multi-Latent Attention with its
// YaRN, multi-token prediction, the padded vocabulary, and activation recompute. Not the parallel splits of these
// sizes (config_validate_parallel.cpp) nor the experts (config_validate_moe.cpp).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "moecore/core/error.h"
#include "moecore/train/config/config_validate.h"

namespace moecore::train {

namespace {

// Attention and position embeddings: Megatron's checks (arguments.py, TransformerConfig).
void validate_attention(const TrainConfig& c) {
  // Megatron: --no-position-embedding is deprecated and allowed only where it changes nothing (rope).
  MOE_CHECK(!c.no_position_embedding || c.position_embedding_type == "rope",
            "--no-position-embedding with --position-embedding-type {} is refused (as Megatron: the flag is "
            "deprecated); use --position-embedding-type none for no position embeddings",
            c.position_embedding_type);
  MOE_CHECK(!(c.swiglu && c.squared_relu), "--swiglu and --squared-relu are exclusive");
  MOE_CHECK(c.num_attention_heads % c.num_query_groups == 0,
            "--num-attention-heads {} must be a multiple of --num-query-groups {}", c.num_attention_heads,
            c.num_query_groups);
  MOE_CHECK(c.max_position_embeddings >= c.seq_length, "--max-position-embeddings {} is below --seq-length {}",
            c.max_position_embeddings, c.seq_length);
  MOE_CHECK(c.position_embedding_type != "rope" ||
                std::llround(static_cast<double>(c.kv_channels) * c.rotary_percent) / 2 * 2 >= 2,
            "--kv-channels {} x --rotary-percent {} rotates fewer than 2 dimensions of each head (RoPE rotates "
            "pairs); raise either",
            c.kv_channels, c.rotary_percent);
}

// Multi-Latent Attention (Megatron's checks in arguments.py and core_transformer_config_from_args) and
// multi-token prediction (its MTP validation in arguments.py).
void validate_mla_and_mtp(const TrainConfig& c) {
  MOE_CHECK(c.rope_type.empty() || c.rope_type == "rope" || c.rope_type == "yarn",
            "--rope-type {} is out of range; accepted: rope, yarn", c.rope_type);
  MOE_CHECK(c.multi_latent_attention || c.rope_type.empty() || c.rope_type == "rope",
            "--rope-type {}: common attention only supports --rope-type rope (as Megatron); yarn is for "
            "--multi-latent-attention",
            c.rope_type);
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
  if (!c.multi_latent_attention) return;
  MOE_CHECK(!c.group_query_attention,
            "--group-query-attention is mutually exclusive with --multi-latent-attention (as Megatron); drop it");
  const bool yarn = c.rope_type != "rope";
  const int64_t rot = yarn ? c.qk_pos_emb_head_dim
                           : static_cast<int64_t>(static_cast<double>(c.qk_pos_emb_head_dim) * c.rotary_percent);
  MOE_CHECK(rot >= 2 && rot % 2 == 0,
            "--qk-pos-emb-head-dim {}{} rotates {} channels; RoPE rotates pairs: use an even number, at least 2",
            c.qk_pos_emb_head_dim, yarn ? "" : fmt::format(" x --rotary-percent {}", c.rotary_percent), rot);
  MOE_CHECK(c.rotary_scaling_factor <= 1 || 0.1 * c.mscale_all_dim * std::log(c.rotary_scaling_factor) + 1 != 0,
            "--mscale-all-dim {} with --rotary-scaling-factor {} makes YaRN's denominator 0", c.mscale_all_dim,
            c.rotary_scaling_factor);
}

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

void validate_model(const TrainConfig& c) {
  validate_attention(c);
  validate_mla_and_mtp(c);
  padded_vocab_size(c, c.vocab_size);  // throws when padding overflows, or --padded-vocab-size is below --vocab-size
  // Megatron's VocabParallelEmbedding splits the rows evenly over TP.
  MOE_CHECK(c.padded_vocab_size % c.tensor_model_parallel_size == 0,
            "--padded-vocab-size {} is not divisible by --tensor-model-parallel-size {}; give a multiple of {}",
            c.padded_vocab_size, c.tensor_model_parallel_size, c.tensor_model_parallel_size);
  validate_recompute(c);
  validate_offload(c);
  validate_fp8(c);
}

}  // namespace moecore::train
