// The interface a transformer layer's FFN slot takes: the dense MLP here, the MoE layer in moe/.
// Each implementation defines its own stash type deriving from FeedForward::Stash.
#pragma once

#include <memory>

#include "moecore/core/tensor.h"
#include "moecore/nn/routing_stats.h"

namespace moecore::nn {

class FeedForward {
 public:
  struct Stash {
    virtual ~Stash() = default;
    // Scale of this micro-batch's LM-loss gradient (1/num_micro_batches in gradient accumulation); auxiliary
    // losses inside the FFN (MoE load balancing) scale their injected gradients by it, as Megatron does.
    double loss_scale = 1.0;
    // Set by the caller for a recompute's replay of a forward (recompute.h): the forward gives the same values and
    // accumulates no statistics or counters.
    bool recompute = false;
  };
  virtual ~FeedForward() = default;
  // Training mode: auxiliary losses, balancing counters and statistics are updated only when training.
  virtual void set_training(bool training) { (void)training; }
  virtual std::unique_ptr<Stash> make_stash() const = 0;
  // x_SBH [S, B, H] -> [S, B, H]
  virtual Tensor forward(const Tensor& x_SBH, Stash& st) = 0;
  // The 16-bit dtype (bf16 or f16) x_SBH feeds GEMMs in, if it feeds such GEMMs only, so the pre-MLP norm may write
  // it in that dtype (the cast fused into the norm). The MoE layer's router reads it in its own dtype: none there.
  virtual LowPrecision low_input() const { return std::nullopt; }
  virtual Tensor backward(const Tensor& dy_SBH, Stash& st) = 0;
  // Recompute (recompute.h). carry_replay: copies what a replay of `from`'s forward needs (router noise index,
  // global-aux counts) into the fresh stash `to`. drop_input / restore_input: forgets every reference the stash
  // holds to the input x (the pre-MLP norm's output, recomputed under --recompute-modules layernorm), and puts
  // them back from the recomputed x before backward.
  virtual void carry_replay(const Stash& from, Stash& to) const {
    (void)from;
    (void)to;
  }
  virtual void drop_input(const Tensor& x, Stash& st) const = 0;
  virtual void restore_input(const Tensor& x, Stash& st) const = 0;
  // Once per optimizer step, after the global batch's gradients are final (MoE: expert-bias counts summed and the
  // bias updated, routing statistics snapshotted and reset). Collective over the ranks that share the batch.
  virtual void finish_global_batch() {}
  // Routing statistics of the last finished global batch; null for an FFN that does not route.
  virtual const RoutingStats* routing_stats() const { return nullptr; }
};

}  // namespace moecore::nn
