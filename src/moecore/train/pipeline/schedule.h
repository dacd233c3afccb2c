// The loop over a step's micro-batches: the one seam pipeline parallelism replaces. Without pipelining (this
// build) each micro-batch runs forward then backward on the whole model; in the last one every layer's gradients
// are handed to the optimizer as soon as they are final, so their reduction overlaps the rest of backward.
// 1F1B and interleaved 1F1B (sending activations between stages) implement the same interface.
#pragma once

#include <memory>

#include "moecore/data/gpt_dataset.h"
#include "moecore/nn/gpt_model.h"
#include "moecore/optim/chained_optimizer.h"

namespace moecore::train {

struct MicroBatches {
  int64_t count = 1;  // micro-batches per step on this data-parallel rank
  int64_t size = 1;   // sequences per micro-batch
  int64_t dp_rank = 0, dp_size = 1;
  int64_t cp_size = 1;  // context parallelism: gradients average over DP×CP, aux losses scaled by CP (Megatron)
  int64_t eod_mask_token = -1;             // --eod-mask-loss: no loss where the input is this token (-1: none)
  bool per_token_loss = false;             // --calculate-per-token-loss
  double loss_scale = 1;                   // the loss scaler's: every gradient seed (token and aux) multiplied by it
  const comm::ProcessGroup* dp = nullptr;  // where the global batch's loss tokens are summed (null: this rank)
};

// This rank's share of a step's LM loss: the sum of its masked token losses and the number of loss tokens. Megatron
// reports sum / tokens over the whole global batch (all micro-batches and DP ranks).
struct StepLoss {
  double sum = 0, tokens = 0;
};

// The loss tokens of a micro-batch (the sum of its loss mask).
double loss_tokens(const data::Batch& b);

// The backward's token scale of a micro-batch with mask_sum loss tokens, in both schedules: the mean over the m
// micro-batches of each one's mean token loss, or with per-token loss the token losses over the global batch's loss
// tokens (× DP, undone by the 1/DP). Known before forward, so the loss's forward computes the logits' gradient too
// (GPTModel::Stash::token_scale_of).
// With a loss scaler, times its scale (Megatron multiplies the loss by it before backward).
struct TokenScale {
  bool per_token_loss;
  double global_tokens, dp;
  int64_t m;
  double loss_scale = 1;
  double operator()(double mask_sum) const {
    if (per_token_loss) return global_tokens > 0 ? dp / global_tokens * loss_scale : 0.0;
    return mask_sum > 0 ? 1.0 / static_cast<double>(m) / mask_sum * loss_scale : 0.0;
  }
};

class Schedule {
 public:
  virtual ~Schedule() = default;
  // Forward and backward over the step's micro-batches from `data` at `cursor` (not advanced), gradients
  // accumulated as the mean over micro-batches of each one's mean token loss (Megatron's default), or with
  // per_token_loss as the sum of token losses over (DP / the global batch's loss tokens), which the optimizer's
  // 1/DP makes the per-token mean; MoE aux losses scaled as Megatron scales them in each form. Returns this rank's
  // loss sum and tokens.
  virtual StepLoss forward_backward(nn::GPTModel& model, nn::GPTModel::Stash& stash, const data::SampleSource& data,
                                    const data::SampleCursor& cursor, const MicroBatches& mb,
                                    optim::ChainedOptimizer& opt) = 0;
};

class NoPipelining : public Schedule {
 public:
  // combined: Megatron's combined 1F1B (combined_1f1b.h), each micro-batch's forward merged with the previous one's
  // backward (--overlap-moe-expert-parallel-comm without --delay-wgrad-compute).
  explicit NoPipelining(bool combined = false) : combined_(combined) {}
  StepLoss forward_backward(nn::GPTModel& model, nn::GPTModel::Stash& stash, const data::SampleSource& data,
                            const data::SampleCursor& cursor, const MicroBatches& mb,
                            optim::ChainedOptimizer& opt) override;

 private:
  bool combined_ = false;
  std::unique_ptr<nn::GPTModel::Stash> second_stash_;  // the combined schedule's other micro-batch
};

}  // namespace moecore::train
