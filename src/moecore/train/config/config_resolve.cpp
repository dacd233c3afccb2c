// The two passes that make a parsed configuration usable (see config.h): resolve_defaults fills the values Megatron
// derives from others (each recorded, so a later pass derives it again), validate checks everything and changes
// nothing: each flag against its table row here, the relations between flags by concern in config_validate_*.cpp.
// resolve runs both, parses --moe-layer-freq, and stamps the result; the Trainer takes only stamped, unchanged
// configurations.
#include <fmt/format.h>

#include <algorithm>
#include <functional>
#include <limits>

#include "moecore/ckpt/foreign_checkpoint.h"
#include "moecore/core/error.h"
#include "moecore/train/config/config.h"
#include "moecore/train/config/config_validate.h"
#include "moecore/train/config/device_support.h"

namespace moecore::train {

namespace {

constexpr const char* kUpProjNoEffect =
    "--recompute-modules mla_up_proj: recomputes Multi-Latent Attention's up projections, and this model has none "
    "(as in Megatron)";

constexpr const char* kOffloadNoEffect =
    "moves GPU activations to host memory while they wait for backward; a CPU run keeps them in host memory already";

// Lists `line` with the Megatron flags that have no effect, once however often resolve runs.
void note_no_effect(TrainConfig& c, const std::string& line) {
  if (std::find(c.no_effect.begin(), c.no_effect.end(), line) == c.no_effect.end()) c.no_effect.push_back(line);
}

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
  // Sample-based training (Megatron's update_train_iters): the iterations follow from the samples.
  if (c.train_samples > 0 && c.train_iters == 0 && c.global_batch_size > 0)
    derive(&TrainConfig::train_iters, c.train_samples / c.global_batch_size);
  if (c.train_samples == 0 && c.lr_decay_iters == 0) derive(&TrainConfig::lr_decay_iters, c.train_iters);
  if (c.train_samples > 0 && c.lr_decay_samples == 0) derive(&TrainConfig::lr_decay_samples, c.train_samples);
  if (c.num_experts > 0 && c.moe_ffn_hidden_size == 0) derive(&TrainConfig::moe_ffn_hidden_size, c.ffn_hidden_size);
  // Activation recompute, as Megatron rewrites it: --recompute-activations is selective granularity;
  // --moe-layer-recompute adds moe to the modules (the default core_attn included) unless granularity is full.
  if (c.recompute_activations) c.recompute_granularity = "selective";
  // Megatron FSDP (version 1) runs under the distributed optimizer: Megatron sets it, and so does moecore.
  if (c.use_megatron_fsdp) c.use_distributed_optimizer = true;
  if (c.moe_layer_recompute && c.recompute_granularity != "full") {
    c.recompute_granularity = "selective";
    if (c.recompute_modules.empty()) c.recompute_modules = {"core_attn"};
    if (std::find(c.recompute_modules.begin(), c.recompute_modules.end(), "moe") == c.recompute_modules.end())
      c.recompute_modules.push_back("moe");
  }
}

void validate(const TrainConfig& c) {
  // Not derivable (H not divisible by the heads) says more than "--kv-channels 0 is out of range".
  MOE_CHECK(c.kv_channels != 0 || c.hidden_size <= 0 || c.num_attention_heads <= 0,
            "--hidden-size {} is not divisible by --num-attention-heads {}; set --kv-channels", c.hidden_size,
            c.num_attention_heads);
  for (const auto& f : flag_table()) check_accepted(c, f);
  // The relations between flags, by concern (config_validate.h).
  validate_model(c);
  validate_parallel(c);
  validate_checkpointing(c);
  validate_optimizer(c);
  validate_data(c);
  validate_moe(c);
  validate_overlap(c);
  validate_fsdp(c);
  validate_cuda_graph(c);
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
  // On the CPU the stashes are in host memory already: offloading selects nothing there (the testing switch runs
  // its copies all the same, to a host pool of their own).
  if (c.fine_grained_activation_offloading && !offloading_applies(training_device(c)))
    note_no_effect(c, "--fine-grained-activation-offloading: " + std::string(kOffloadNoEffect));
  // Megatron reads the other offloading flags only with --fine-grained-activation-offloading.
  const TrainConfig plain;
  if (!c.fine_grained_activation_offloading &&
      (!c.offload_modules.empty() || c.min_offloaded_tensor_size != plain.min_offloaded_tensor_size ||
       c.fine_grained_offloading_max_inflight_offloads != plain.fine_grained_offloading_max_inflight_offloads))
    note_no_effect(c,
                   "--offload-modules, --min-offloaded-tensor-size, --fine-grained-offloading-max-inflight-offloads: "
                   "read only with --fine-grained-activation-offloading (as in Megatron)");
  if (const std::string line = fsdp_no_effect(c); !line.empty()) note_no_effect(c, line);
  // The FP8 recipe flags without --fp8-format (Megatron reads them only with it).
  if (const std::string line = fp8_no_effect(c); !line.empty()) note_no_effect(c, line);
  // --moe-layer-freq, once for every user (validated --num-layers: the list has one entry per layer).
  c.is_moe_layer.assign(static_cast<size_t>(c.num_layers), false);
  if (c.num_experts > 0) c.is_moe_layer = moe::parse_moe_layer_freq(c.moe_layer_freq, c.num_layers);
  c.resolved_fingerprint = fingerprint(c);
}

bool is_resolved(const TrainConfig& c) {
  return c.resolved_fingerprint != 0 && c.resolved_fingerprint == fingerprint(c);
}

}  // namespace moecore::train
