// Token embedding table [V, H], looked up by id. Under tensor parallelism the table is vocabulary-parallel: each
// rank holds rows [r·V/TP, (r+1)·V/TP), looks up the ids it owns (zeros elsewhere) and the partial rows are
// reduce-scattered into sequence shards [S/TP·B, H] (Megatron's VocabParallelEmbedding with sequence parallelism).
#pragma once

#include <string>

#include "moecore/nn/parameter.h"
#include "moecore/nn/tensor_parallel.h"

namespace moecore::nn {

class Embedding {
 public:
  struct Stash {
    Tensor ids_T;
  };
  Embedding(ParamRegistry& reg, const std::string& name, int64_t vocab, int64_t hidden, double init_std,
            TPContext tp = {});
  // ids_T [T] (i32/i64), T = S·B sequence-major -> [T/TP, H] (this rank's sequence shard)
  Tensor forward(const Tensor& ids_T, Stash& st);
  // dy [T/TP, H] -> accumulates into the table's gradient.
  void backward(const Tensor& dy_TH, Stash& st);
  Parameter& weight() { return *weight_; }
  int64_t vocab_start() const { return vocab_start_; }

 private:
  Parameter* weight_;
  TPContext tp_;
  int64_t vocab_ = 0, vocab_start_ = 0;
};

}  // namespace moecore::nn
