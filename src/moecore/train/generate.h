// Sampling continuations from a model: greedy or temperature + top-k, one token at a time over the last
// --seq-length tokens. And the model `moecore generate` samples from: a checkpoint's model on one process, built
// from the checkpoint's configuration whatever layout saved it. No training here.
#pragma once

#include <memory>
#include <string>

#include "moecore/nn/gpt_model.h"
#include "moecore/train/config/config.h"
#include "moecore/train/model_builder.h"

namespace moecore::train {

struct SamplingOptions {
  int64_t tokens = 48;     // new tokens at most (stops early at the tokenizer's EOS)
  double temperature = 0;  // 0: greedy
  int64_t top_k = 0;       // 0: the whole vocabulary
  uint64_t seed = 0;
  int64_t context = 0;  // tokens the model sees (its --seq-length)
};

// `prompt` continued; the text of prompt and continuation.
std::string generate_text(nn::GPTModel& model, const data::Tokenizer& tok, int64_t vocab, const std::string& prompt,
                          const SamplingOptions& o);

// The model of the checkpoint in `load` (root or iteration directory), on this process alone, with the tokenizer
// saved in the checkpoint (or `tokenizer_model` when given), on `device`: loaded on the host, then its parameters
// moved there (as the trainer moves a run's); the logits come back to the host for sampling.
class CheckpointModel {
 public:
  CheckpointModel(const std::string& load, const std::string& tokenizer_model, Device device = Device::cpu());
  ~CheckpointModel();
  std::string generate(const std::string& prompt, SamplingOptions o);
  const std::string& dir() const { return dir_; }
  int64_t iteration() const { return iteration_; }

 private:
  TrainConfig c_;
  std::string dir_;
  int64_t iteration_ = 0;
  std::unique_ptr<ParallelGroups> groups_;
  Vocabulary vocab_;
  nn::ParamRegistry reg_;
  std::unique_ptr<nn::GPTModel> model_;
};

}  // namespace moecore::train
