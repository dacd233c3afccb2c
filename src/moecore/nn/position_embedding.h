// Learned absolute position embeddings (Megatron's LanguageModelEmbedding.position_embeddings, its default
// --position-embedding-type learned_absolute): a table [max positions, H], init normal(0, init_method_std), whose
// row s is added to the word embedding of every token at position s. Not RoPE (attention.h). Under tensor
// parallelism the table is replicated; each rank adds the rows of its own sequence shard [S/TP, B, H] (what
// Megatron adds before the scatter, the same numbers), so its gradient is partial per rank and summed over TP like
// every replicated parameter's (parameter.h).
#pragma once

#include <string>
#include <string_view>

#include "moecore/nn/context_split.h"
#include "moecore/nn/parameter.h"
#include "moecore/nn/tensor_parallel.h"

namespace moecore::nn {

enum class PositionEmbeddingType { LearnedAbsolute, Rope, None };
// Megatron's spelling: learned_absolute, rope, none; the others (yarn, mrope, relative) are refused.
PositionEmbeddingType parse_position_embedding_type(std::string_view s);

class PositionEmbedding {
 public:
  struct Stash {
    int64_t s0 = 0;  // first position of this rank's sequence shard
    SeqSplit seq;    // set by the caller under context parallelism: positions of the local rows
  };
  PositionEmbedding(ParamRegistry& reg, const std::string& name, int64_t max_positions, int64_t hidden, double init_std,
                    TPContext tp = {});
  // h_SBH [S/TP, B, H], this rank's sequence shard of the word embeddings: h[s, b] += table[s0 + s].
  void forward_(Tensor& h_SBH, Stash& st);
  // dh_SBH [S/TP, B, H] -> table gradient rows s0.. accumulate Σ_b dh[s, b].
  void backward(const Tensor& dh_SBH, Stash& st);

 private:
  Parameter* weight_;
  TPContext tp_;
};

}  // namespace moecore::nn
