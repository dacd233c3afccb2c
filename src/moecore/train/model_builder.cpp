// Vocabulary, datasets and model from the configuration (see model_builder.h).
#include "moecore/train/model_builder.h"

#include <string>

#include "moecore/core/error.h"
#include "moecore/data/preprocess.h"
#include "moecore/train/config/context_parallel.h"
#include "moecore/train/pipeline/pipeline_stages.h"

namespace moecore::train {

Vocabulary build_vocabulary(const TrainConfig& c, int64_t saved_rows) {
  Vocabulary v;
  if (c.tokenizer_type == "HuggingFaceTokenizer" || c.tokenizer_type == "GPT2BPETokenizer") {
    v.tokenizer = std::make_unique<data::Tokenizer>(
        data::load_tokenizer(c.tokenizer_type, c.tokenizer_model, c.vocab_file, c.merge_file));
    v.size = v.tokenizer->vocab_size();
  } else {
    v.size = c.tokenizer_type == "NullTokenizer" ? c.vocab_size + 1 : c.vocab_size;  // NullTokenizer: + EOD
  }
  v.padded = padded_vocab_size(c, v.size);
  // Megatron compares --padded-vocab-size with the checkpoint's (check_checkpoint_args).
  MOE_CHECK(
      c.padded_vocab_size == 0 || saved_rows == 0 || saved_rows == c.padded_vocab_size,
      "--padded-vocab-size {} differs from the {} vocabulary rows of the checkpoint being loaded; give {} or leave "
      "it out",
      c.padded_vocab_size, saved_rows, saved_rows);
  if (saved_rows >= v.size && saved_rows % c.tensor_model_parallel_size == 0) v.padded = saved_rows;
  return v;
}

std::array<std::shared_ptr<const data::SampleSource>, 3> build_datasets(const TrainConfig& c, int64_t vocab) {
  const int64_t gbs = c.global_batch_size;
  int64_t train_samples = 0, valid_samples = 0;  // every evaluation reads the same first batches
  MOE_CHECK(!__builtin_mul_overflow(c.skip_train ? 0 : c.train_iters, gbs, &train_samples) &&
                !__builtin_mul_overflow(c.eval_iters, gbs, &valid_samples),
            "--train-iters {} or --eval-iters {} times --global-batch-size {} samples do not fit in 64 bits",
            c.train_iters, c.eval_iters, gbs);
  std::array<std::shared_ptr<const data::SampleSource>, 3> d;
  if (c.mock_data) {
    const uint64_t seed = static_cast<uint64_t>(c.seed);
    if (train_samples > 0) d[0] = std::make_shared<data::MockGPTDataset>(train_samples, c.seq_length, vocab, seed);
    if (valid_samples > 0) d[1] = std::make_shared<data::MockGPTDataset>(valid_samples, c.seq_length, vocab, seed + 1);
  } else {
    d = data::build_gpt_datasets(c.data_path, c.split, c.seq_length, {train_samples, valid_samples, 0},
                                 static_cast<uint64_t>(c.seed));
  }
  MOE_CHECK(c.skip_train || d[0], "no training data: --split {} gives the train split no documents", c.split);
  return d;
}

nn::RecomputeConfig recompute_config(const TrainConfig& c) {
  nn::RecomputeConfig r;
  if (c.recompute_granularity == "full") {
    r.full = true;
    r.method =
        c.recompute_method == "block" ? nn::RecomputeConfig::Method::Block : nn::RecomputeConfig::Method::Uniform;
    r.num_layers = c.recompute_num_layers;
  } else if (c.recompute_granularity == "selective") {
    const std::vector<std::string> modules =
        c.recompute_modules.empty() ? std::vector<std::string>{"core_attn"} : c.recompute_modules;
    for (const std::string& m : modules) {
      r.core_attn |= m == "core_attn";
      r.moe_act |= m == "moe_act";
      r.layernorm |= m == "layernorm";
      r.mlp |= m == "mlp";
      r.moe |= m == "moe";
      r.shared_experts |= m == "shared_experts";
      r.mla_up_proj |= m == "mla_up_proj";
    }
  }
  return r;
}

std::unique_ptr<nn::GPTModel> build_model(const TrainConfig& c, int64_t padded_vocab, nn::ParamRegistry& reg,
                                          const ParallelGroups& g) {
  nn::FfnFactory ffn = nullptr;
  const nn::RecomputeConfig rc = recompute_config(c);
  if (c.num_experts > 0) {
    const std::vector<bool>& is_moe = c.is_moe_layer;
    MOE_ASSERT(std::ssize(is_moe) == c.num_layers);
    moe::MoELayerConfig mc = moe_layer_config(c);
    mc.ep_group = ParallelGroups::active(g.ep);
    mc.etp_group = ParallelGroups::active(g.etp);
    mc.tp.group = ParallelGroups::active(g.tp);
    if (g.cp_size > 1) mc.tp_cp_group = ParallelGroups::active(g.tp_cp);
    mc.router.global_group = ParallelGroups::active(g.tp_dp);
    mc.router.global_grad_scale = static_cast<double>(g.dp_size);
    mc.recompute_moe = rc.moe;
    mc.recompute_moe_act = rc.moe_act;
    mc.recompute_shared_experts = rc.shared_experts;
    ffn = [is_moe, mc](nn::ParamRegistry& r, const std::string& name, int64_t i) -> std::unique_ptr<nn::FeedForward> {
      if (!is_moe[static_cast<size_t>(i)]) return nullptr;
      return std::make_unique<moe::MoELayer>(r, name, mc);
    };
  }
  nn::GPTConfig gc = gpt_config(c, padded_vocab);
  gc.tp.group = ParallelGroups::active(g.tp);
  gc.recompute = rc;
  gc.mla.recompute_up_proj = rc.mla_up_proj;
  if (g.cp_size > 1) {  // context parallelism: this rank's chunks, attention over the CP group
    gc.cp.group = g.cp.get();
    gc.cp.size = g.cp_size;
    gc.cp.rank = g.cp_rank;
    gc.cp.inner = g.cp_inner.get();
    gc.cp.outer = g.cp_outer.get();
    gc.cp_comm_types = cp_comm_types(c);
    gc.cp.comm_type = gc.cp_comm_types.at(0);
  }
  if (c.pipeline_model_parallel_size > 1)  // this pipeline rank's chunks (global layer indices)
    for (const StageLayers& s : pipeline_stage_layers(c, g.pp_rank))
      gc.chunks.push_back({s.first_layer, s.num_layers, s.embedding, s.loss});
  // The FP8 sites are chosen while the model is built (nn/fp8_recipe.h).
  const nn::Fp8ModelScope fp8_scope(fp8_config(c));
  auto model = std::make_unique<nn::GPTModel>(gc, reg, ffn);
  reg.initialize(static_cast<uint64_t>(c.seed));
  return model;
}

std::vector<moe::MoELayer*> moe_layers(nn::GPTModel& model) {
  std::vector<moe::MoELayer*> v;
  for (size_t i = 0; i < model.num_layers(); i++)
    if (auto* l = dynamic_cast<moe::MoELayer*>(&model.layer(i).ffn())) v.push_back(l);
  if (nn::MTPBlock* m = model.mtp())  // MTP depths of MoE kind: their expert bias and counters are saved too
    for (size_t k = 0; k < m->num_layers(); k++)
      if (auto* l = dynamic_cast<moe::MoELayer*>(&m->layer(k).ffn())) v.push_back(l);
  return v;
}

size_t layer_of(const nn::Parameter& p, size_t num_layers) {
  const std::string pre = "decoder.layers.";
  if (p.name.rfind(pre, 0) == 0) return std::stoul(p.name.substr(pre.size()));
  return num_layers;  // embedding, final norm, output layer
}

}  // namespace moecore::train
