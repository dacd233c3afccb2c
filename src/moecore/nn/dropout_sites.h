// Dropout sites of the model (Megatron's hidden dropout on the embedding output and in each bias-dropout-add,
// attention dropout on the softmax probabilities) and what they need of the micro-batch. Masks are functions of
// global coordinates (kernels/cpu/dropout.h): the site's name, the run's seed, each sequence's global sample index,
// the position in the full sequence and the hidden or head index, so every layout drops the same elements.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "moecore/kernels/attention.h"
#include "moecore/kernels/dropout.h"
#include "moecore/nn/context_split.h"
#include "moecore/nn/tensor_parallel.h"

namespace moecore::nn {

// A micro-batch's dropout state: on only in training; sample_B [B] the global index of each sequence in the run
// (the consumed-sample index the data sampler gave it), so a step's masks differ from every other step's.
struct DropoutBatch {
  bool training = false;
  uint64_t seed = 0;
  std::vector<int64_t> sample_B;
  SeqSplit seq;  // context parallelism: the global position of each local row
};

// Attention dropout of a batch (Attention and MLAttention): the mask of `site` (a stream id) with probability p, this
// rank's query heads starting at global head `head_offset`; off outside training or with p = 0.
inline kernels::AttentionDropout attention_dropout(const DropoutBatch& d, uint64_t site, double p,
                                                   int64_t head_offset) {
  kernels::AttentionDropout a;
  if (!d.training || p <= 0) return a;
  a.mask = kernels::DropoutMask::make(d.seed, site, p);
  a.sample_B = d.sample_B.data();
  a.head_offset = head_offset;
  return a;
}

// Hidden dropout at one site, on sequence shards [S/TP, B, H] (the rank's shard starts at position rank·S/TP).
class HiddenDropout {
 public:
  HiddenDropout() = default;
  HiddenDropout(const std::string& site, double p, TPContext tp) : site_(stream_of(site)), p_(p), tp_(tp) {}
  bool on(const DropoutBatch& d) const { return p_ > 0 && d.training; }
  // x_SBH ⊙ mask, in place; nothing outside training.
  void forward_(Tensor& x_SBH, const DropoutBatch& d) const;
  // dy ⊙ mask as a new tensor (dy is still needed by the residual path); dy itself outside training.
  Tensor backward(const Tensor& dy_SBH, const DropoutBatch& d) const;

 private:
  static uint64_t stream_of(const std::string& site);
  kernels::DropoutMask mask(uint64_t seed) const { return kernels::DropoutMask::make(seed, site_, p_); }
  uint64_t site_ = 0;
  double p_ = 0;
  TPContext tp_;
};

}  // namespace moecore::nn
