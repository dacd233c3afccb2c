// What a run is built from, each from the resolved configuration: the vocabulary (tokenizer and padded size), the
// datasets, and the model (dense or MoE layers by --moe-layer-freq, sharded by the run's groups, initialized from
// the seed). `moecore train` and `moecore generate` both build through here; nothing here trains or loads weights.
#pragma once

#include <array>
#include <memory>
#include <vector>

#include "moecore/data/gpt_dataset.h"
#include "moecore/data/tokenizer.h"
#include "moecore/moe/moe_layer.h"
#include "moecore/nn/gpt_model.h"
#include "moecore/train/config/config.h"
#include "moecore/train/parallel_groups.h"

namespace moecore::train {

struct Vocabulary {
  std::unique_ptr<data::Tokenizer> tokenizer;  // null without a tokenizer (NullTokenizer, mock data)
  int64_t size = 0;                            // token ids the data may hold (NullTokenizer: --vocab-size + EOD)
  int64_t padded = 0;                          // rows of the embedding and output layer
};

// `saved_rows`: the vocabulary rows of the model about to be loaded (0: none), kept when at least `size` and
// divisible by TP, so a loaded model's output layer, logits and loss are the same in every layout.
Vocabulary build_vocabulary(const TrainConfig& c, int64_t saved_rows = 0);

// Train and validation sources with enough samples for every step and every evaluation ([2], test, is unused).
std::array<std::shared_ptr<const data::SampleSource>, 3> build_datasets(const TrainConfig& c, int64_t vocab);

// The --recompute-* flags as the model takes them (MoE layers: moe, moe_act and shared_experts of it).
nn::RecomputeConfig recompute_config(const TrainConfig& c);
// The model on this rank's shards, its parameters in `reg`, initialized from --seed (layout-independent).
std::unique_ptr<nn::GPTModel> build_model(const TrainConfig& c, int64_t padded_vocab, nn::ParamRegistry& reg,
                                          const ParallelGroups& g);

// The model's MoE layers, in layer order (their routers hold checkpointed state: expert bias, noise counters).
std::vector<moe::MoELayer*> moe_layers(nn::GPTModel& model);

// The gradient bucket of a parameter: its transformer layer, or num_layers for the embedding, final norm and
// output layer.
size_t layer_of(const nn::Parameter& p, size_t num_layers);

}  // namespace moecore::train
