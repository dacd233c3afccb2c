// Model presets (see presets.h): code setting TrainConfig fields, one function per preset.
#include "moecore/train/config/presets.h"

#include <functional>
#include <utility>

#include "moecore/core/error.h"

namespace moecore::train {

namespace {

using Preset = std::pair<std::string, std::function<void(TrainConfig&)>>;

const std::vector<Preset>& presets() {
  static const std::vector<Preset> all = {
      {"tiny-moe",
       [](TrainConfig& x) {  // the demo: 8 experts, top-2, a few million parameters
         x.normalization = "RMSNorm", x.position_embedding_type = "rope";  // not Megatron's defaults
         x.num_layers = 4, x.hidden_size = 256, x.num_attention_heads = 4, x.group_query_attention = true;
         x.num_query_groups = 2, x.ffn_hidden_size = 512, x.swiglu = true, x.disable_bias_linear = true;
         x.num_experts = 8, x.moe_router_topk = 2, x.moe_ffn_hidden_size = 256;
         x.moe_router_load_balancing_type = {"aux_loss"}, x.moe_aux_loss_coeff = {"1e-2"}, x.moe_z_loss_coeff = 1e-3;
         x.seq_length = 128, x.micro_batch_size = 8, x.global_batch_size = 16;
         x.lr = 2e-3, x.min_lr = 1e-4, x.lr_warmup_iters = 20, x.lr_decay_style = "cosine", x.weight_decay = 0.1;
         x.hidden_dropout = 0, x.attention_dropout = 0;  // none in the modelled MoEs
       }},
      {"mixtral",
       [](TrainConfig& x) {  // softmax top-2 over 8 experts, no shared expert, GQA, untied output
         x.normalization = "RMSNorm", x.position_embedding_type = "rope";  // not Megatron's defaults
         x.num_layers = 4, x.hidden_size = 512, x.num_attention_heads = 8, x.group_query_attention = true;
         x.num_query_groups = 2, x.swiglu = true, x.disable_bias_linear = true, x.rotary_base = 1e6;
         x.untie_embeddings_and_output_weights = true, x.num_experts = 8, x.moe_router_topk = 2;
         x.moe_ffn_hidden_size = 1024, x.ffn_hidden_size = 1024, x.moe_aux_loss_coeff = {"1e-2"};
         x.hidden_dropout = 0, x.attention_dropout = 0;  // none in the modelled MoEs
       }},
      {"qwen3-moe",
       [](TrainConfig& x) {  // qk-norm, fine-grained experts, top-8, fp32 router
         x.normalization = "RMSNorm", x.position_embedding_type = "rope";  // not Megatron's defaults
         x.num_layers = 4, x.hidden_size = 512, x.num_attention_heads = 8, x.kv_channels = 64;
         x.group_query_attention = true, x.num_query_groups = 2, x.qk_layernorm = true, x.swiglu = true;
         x.disable_bias_linear = true, x.rotary_base = 1e6, x.untie_embeddings_and_output_weights = true;
         x.num_experts = 32, x.moe_router_topk = 8, x.moe_ffn_hidden_size = 128, x.ffn_hidden_size = 1024;
         x.moe_aux_loss_coeff = {"1e-3"};
         x.hidden_dropout = 0, x.attention_dropout = 0;  // none in the modelled MoEs
       }},
      {"olmoe",
       [](TrainConfig& x) {  // qk-norm, 64 experts top-8 scaled down, aux and z losses
         x.normalization = "RMSNorm", x.position_embedding_type = "rope";  // not Megatron's defaults
         x.num_layers = 4, x.hidden_size = 512, x.num_attention_heads = 8, x.qk_layernorm = true, x.swiglu = true;
         x.disable_bias_linear = true, x.untie_embeddings_and_output_weights = true, x.num_experts = 32;
         x.moe_router_topk = 4, x.moe_ffn_hidden_size = 128, x.ffn_hidden_size = 1024;
         x.moe_aux_loss_coeff = {"1e-2"}, x.moe_z_loss_coeff = 1e-3;
         x.hidden_dropout = 0, x.attention_dropout = 0;  // none in the modelled MoEs
       }},
      {"deepseek-v3",
       [](TrainConfig& x) {  // MLA + YaRN, sigmoid, groups, expert bias, scaling, shared expert, first layer dense
         x.normalization = "RMSNorm", x.position_embedding_type = "rope";  // not Megatron's defaults
         x.num_layers = 4, x.hidden_size = 512, x.num_attention_heads = 8, x.swiglu = true;
         // DeepSeek-V3's MLA scaled down (q_lora 1536, kv_lora 512, qk 128 + 64, v 128 at H 7168), its YaRN as
         // published (factor 40, mscale = mscale_all_dim = 1; context 4096 and betas 32/1 are MLA's defaults).
         x.multi_latent_attention = true, x.q_lora_rank = 192, x.kv_lora_rank = 64, x.qk_head_dim = 32;
         x.qk_pos_emb_head_dim = 16, x.v_head_dim = 32, x.qk_layernorm = true, x.rope_type = "yarn";
         x.rotary_scaling_factor = 40, x.mscale = 1.0, x.mscale_all_dim = 1.0;
         x.disable_bias_linear = true, x.untie_embeddings_and_output_weights = true, x.ffn_hidden_size = 1024;
         x.num_experts = 32, x.moe_router_topk = 4, x.moe_ffn_hidden_size = 128;
         x.moe_router_score_function = "sigmoid", x.moe_router_num_groups = 4, x.moe_router_group_topk = 2;
         x.moe_router_enable_expert_bias = true, x.moe_router_bias_update_rate = 1e-3;
         x.moe_router_topk_scaling_factor = 2.5, x.moe_shared_expert_intermediate_size = 128;
         x.moe_layer_freq = "([0]*1+[1]*3)", x.moe_router_load_balancing_type = {"seq_aux_loss"};
         x.moe_aux_loss_coeff = {"1e-4"};
         x.mtp_num_layers = 1;                           // DeepSeek-V3's one MTP module (its layer 61)
         x.hidden_dropout = 0, x.attention_dropout = 0;  // none in the modelled MoEs
       }},
      {"kimi-k2",
       [](TrainConfig& x) {  // DeepSeek-V3's architecture (HF DeepseekV3ForCausalLM) with Kimi-K2's choices
         apply_preset("deepseek-v3", x);
         // Kimi-K2 against DeepSeek-V3: half the heads (64 of 128), 1.5x the experts (384 of 256, 8 active, one
         // shared), no group-limited routing (n_group 1), routed scaling 2.827, rope_theta 50000 with YaRN factor
         // 32, no MTP module in the published checkpoint (num_nextn_predict_layers 0); here at the preset's size.
         x.num_attention_heads = 4, x.num_experts = 48, x.moe_router_num_groups = 0, x.moe_router_group_topk = 0;
         x.moe_router_topk_scaling_factor = 2.827, x.rotary_base = 50000, x.rotary_scaling_factor = 32;
         x.mtp_num_layers = 0;
       }},
      // Full-size published models, for `moecore plan` (training them needs the ranks and memory the plan shows).
      {"deepseek-v3-671b",
       [](TrainConfig& x) {  // DeepSeek-V3 as Megatron's recipes train it, without the MTP module
         x.normalization = "RMSNorm", x.position_embedding_type = "rope";
         x.num_layers = 61, x.hidden_size = 7168, x.num_attention_heads = 128, x.swiglu = true;
         x.multi_latent_attention = true, x.q_lora_rank = 1536, x.kv_lora_rank = 512, x.qk_head_dim = 128;
         x.qk_pos_emb_head_dim = 64, x.v_head_dim = 128, x.qk_layernorm = true, x.rope_type = "yarn";
         x.rotary_scaling_factor = 40, x.mscale = 1.0, x.mscale_all_dim = 1.0, x.rotary_base = 10000;
         x.disable_bias_linear = true, x.untie_embeddings_and_output_weights = true, x.ffn_hidden_size = 18432;
         x.num_experts = 256, x.moe_router_topk = 8, x.moe_ffn_hidden_size = 2048;
         x.moe_shared_expert_intermediate_size = 2048, x.moe_layer_freq = "([0]*3+[1]*58)";
         x.moe_router_score_function = "sigmoid", x.moe_router_num_groups = 8, x.moe_router_group_topk = 4;
         x.moe_router_enable_expert_bias = true, x.moe_router_bias_update_rate = 1e-3;
         x.moe_router_topk_scaling_factor = 2.5, x.moe_router_load_balancing_type = {"seq_aux_loss"};
         x.moe_aux_loss_coeff = {"1e-4"}, x.vocab_size = 129280, x.seq_length = 4096;
         x.max_position_embeddings = 4096, x.hidden_dropout = 0, x.attention_dropout = 0;
       }},
      {"qwen3-235b",
       [](TrainConfig& x) {  // Qwen3-235B-A22B: 94 MoE layers, 128 experts top-8, GQA 64/4, qk-norm
         x.normalization = "RMSNorm", x.position_embedding_type = "rope";
         x.num_layers = 94, x.hidden_size = 4096, x.num_attention_heads = 64, x.kv_channels = 128;
         x.group_query_attention = true, x.num_query_groups = 4, x.qk_layernorm = true, x.swiglu = true;
         x.disable_bias_linear = true, x.rotary_base = 1e6, x.untie_embeddings_and_output_weights = true;
         x.num_experts = 128, x.moe_router_topk = 8, x.moe_ffn_hidden_size = 1536, x.ffn_hidden_size = 12288;
         x.moe_aux_loss_coeff = {"1e-3"}, x.vocab_size = 151936, x.seq_length = 4096;
         x.max_position_embeddings = 40960, x.hidden_dropout = 0, x.attention_dropout = 0;
       }},
  };
  return all;
}

}  // namespace

std::vector<std::string> preset_names() {
  std::vector<std::string> names;
  for (const auto& [name, set] : presets()) names.push_back(name);
  return names;
}

void apply_preset(const std::string& name, TrainConfig& c) {
  for (const auto& [preset, set] : presets())
    if (preset == name) return set(c);
  std::string names;
  for (const auto& n : preset_names()) names += (names.empty() ? "" : ", ") + n;
  MOE_CHECK(false, "--model {} is not a preset; choose one of {}", name, names);
}

}  // namespace moecore::train
